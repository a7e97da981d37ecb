//! `-o jsonpath=TEMPLATE`: kubectl's field selection, over the same JSON
//! that `-o json` prints.
//!
//! A template is text with `{EXPR}` parts, as kubectl's: text outside the
//! braces is printed as written, `{"\n"}` is a JSON string literal, and
//! any other `{EXPR}` is a JSONPath query (RFC 9535, through
//! `serde_json_path`) whose matches are printed separated by spaces:
//! strings as they are, anything else as compact JSON. `EXPR` may start
//! with `$`, or with `.` or `[` (rooted at the output, as kubectl's `{.x}`),
//! or with a field name. The root is what `-o json` prints: for `ls`, an
//! array of rows, so `{[*].name}` lists the names and
//! `{[?@.status=='queued'].name}` those queued. kubectl's `{range}` and
//! `{end}` are not supported (a `[*]` query does what they are mostly used
//! for). Nothing is printed after the template (kubectl's habit: end it
//! with `{"\n"}`).

use serde_json::Value;
use serde_json_path::JsonPath;

/// A parsed template.
#[derive(Debug, Clone)]
pub(crate) struct Template {
    parts: Vec<Part>,
    /// As given, for equality and messages.
    text: String,
}

impl PartialEq for Template {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

impl Eq for Template {}

#[derive(Debug, Clone)]
enum Part {
    Text(String),
    Query(JsonPath),
}

impl Template {
    /// Parses `text`; the error says what is wrong and where.
    pub(crate) fn parse(text: &str) -> Result<Template, String> {
        let mut parts = Vec::new();
        let mut rest = text;
        while !rest.is_empty() {
            let Some(open) = rest.find('{') else {
                parts.push(Part::Text(rest.to_string()));
                break;
            };
            if open > 0 {
                parts.push(Part::Text(rest[..open].to_string()));
            }
            let body = &rest[open + 1..];
            let close = closing_brace(body)
                .ok_or_else(|| format!("jsonpath: a '{{' at byte {open} is never closed"))?;
            let expr = body[..close].trim();
            parts.push(part(expr)?);
            rest = &body[close + 1..];
        }
        if parts.is_empty() {
            return Err("jsonpath: the template is empty (try -o jsonpath='{[*].name}')".into());
        }
        Ok(Template {
            parts,
            text: text.to_string(),
        })
    }

    /// The template applied to `value`.
    pub(crate) fn render(&self, value: &Value) -> String {
        let mut out = String::new();
        for p in &self.parts {
            match p {
                Part::Text(t) => out.push_str(t),
                Part::Query(q) => {
                    let shown: Vec<String> = q
                        .query(value)
                        .all()
                        .into_iter()
                        .map(|v| match v {
                            Value::String(s) => s.clone(),
                            other => other.to_string(),
                        })
                        .collect();
                    out.push_str(&shown.join(" "));
                }
            }
        }
        out
    }
}

/// Where the `}` that closes a part is, skipping braces inside quoted
/// strings (a filter may compare with `'}'`).
fn closing_brace(body: &str) -> Option<usize> {
    let mut quote = None;
    let mut escaped = false;
    for (i, c) in body.char_indices() {
        match quote {
            Some(q) => {
                if escaped {
                    escaped = false;
                } else if c == '\\' {
                    escaped = true;
                } else if c == q {
                    quote = None;
                }
            }
            None => match c {
                '\'' | '"' => quote = Some(c),
                '}' => return Some(i),
                _ => {}
            },
        }
    }
    None
}

fn part(expr: &str) -> Result<Part, String> {
    if expr.starts_with('"') {
        return serde_json::from_str::<String>(expr)
            .map(Part::Text)
            .map_err(|e| format!("jsonpath: {expr} is not a JSON string: {e}"));
    }
    if expr == "end" || expr.starts_with("range ") {
        return Err(format!(
            "jsonpath: {{{expr}}} is not supported; a [*] query selects every row (e.g. {{[*].name}})"
        ));
    }
    let query = if expr.starts_with('$') {
        expr.to_string()
    } else if let Some(index) = expr.strip_prefix(".[") {
        // `{.[0]}`: the root's element, as `{[0]}`.
        format!("$[{index}")
    } else if expr.starts_with('.') || expr.starts_with('[') {
        format!("${expr}")
    } else if expr.is_empty() {
        return Err("jsonpath: an empty {} (try {[*].name})".into());
    } else {
        format!("$.{expr}")
    };
    JsonPath::parse(&query)
        .map(Part::Query)
        .map_err(|e| format!("jsonpath: {{{expr}}}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows() -> Value {
        serde_json::json!([
            {"name": "web", "status": "running", "epoch": 3, "labels": {"team": "a"}},
            {"name": "batch", "status": "queued", "epoch": null},
        ])
    }

    #[test]
    fn templates_as_kubectl_writes_them() {
        let cases = [
            ("{[*].name}", "web batch"),
            ("{.[*].name}", "web batch"),
            ("{$[0].epoch}", "3"),
            ("{[1].epoch}", "null"),
            ("{[0].labels}", r#"{"team":"a"}"#),
            ("{[?@.status=='queued'].name}{\"\\n\"}", "batch\n"),
            ("names: {[*].name}!", "names: web batch!"),
            ("{[?@.name=='}'].name}", ""),
            ("{[5].name}", ""),
        ];
        for (t, want) in cases {
            let got = Template::parse(t).unwrap().render(&rows());
            assert_eq!(got, want, "{t}");
        }
    }

    #[test]
    fn bad_templates_say_what_is_wrong() {
        for (t, says) in [
            ("{[*].name", "never closed"),
            ("{range [*]}{.name}{end}", "not supported"),
            ("{[*.name}", "jsonpath: {[*.name}"),
            ("", "empty"),
            ("{}", "empty"),
            ("{\"\\q\"}", "not a JSON string"),
        ] {
            let e = Template::parse(t).unwrap_err();
            assert!(e.contains(says), "{t}: {e}");
        }
    }
}
