//! Names of leases, nodes and sessions.
//!
//! A name becomes one path segment of an object key (`leases/<name>`), so it is
//! validated before it reaches a key: caller data never becomes a path by
//! accident. The rules are deliberately narrow (the DNS-label-like set that
//! every object store, file system and shell handles without quoting).

use crate::error::Error;
use std::fmt;

/// Longest name accepted, in bytes.
pub const MAX_NAME_LEN: usize = 128;

/// A validated name: 1 to 128 bytes of `[A-Za-z0-9._-]`, starting with a
/// letter or digit, never containing `..`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Name(String);

impl Name {
    /// Validates `s` as a name.
    pub fn new(s: impl Into<String>) -> Result<Self, Error> {
        let s = s.into();
        validate(&s).map_err(|reason| Error::InvalidName {
            name: s.clone(),
            reason: reason.to_string(),
        })?;
        Ok(Name(s))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

fn validate(s: &str) -> Result<(), &'static str> {
    if s.is_empty() {
        return Err("must not be empty");
    }
    if s.len() > MAX_NAME_LEN {
        return Err("longer than 128 bytes");
    }
    if s.chars().any(|c| c.is_control()) {
        return Err("contains a control character");
    }
    if s.contains('/') || s.contains('\\') {
        return Err("contains a path separator");
    }
    if s.contains("..") {
        return Err("contains \"..\"");
    }
    if !s.is_ascii() {
        return Err("must be ASCII: A-Z, a-z, 0-9, '.', '_' and '-'");
    }
    if !s.chars().next().is_some_and(|c| c.is_ascii_alphanumeric()) {
        return Err("must start with an ASCII letter or digit");
    }
    if s.chars()
        .any(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err("may contain only ASCII letters, digits, '.', '_' and '-'");
    }
    Ok(())
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for Name {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        Name::new(s)
    }
}

impl AsRef<str> for Name {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_ordinary_names() {
        for ok in ["a", "web-1", "job.nightly_2", "0abc", &"x".repeat(128)] {
            assert_eq!(Name::new(ok).unwrap().as_str(), ok);
        }
    }

    #[test]
    fn refuses_bad_names_with_reason() {
        let cases = [
            ("", "empty"),
            (&"x".repeat(129) as &str, "longer"),
            ("a/b", "separator"),
            ("a\\b", "separator"),
            ("a..b", ".."),
            ("..", ".."),
            (".hidden", "start"),
            ("-x", "start"),
            ("a\nb", "control"),
            ("a\u{7f}", "control"),
            ("a b", "letters"),
            ("é", "ASCII"),
            ("日本", "ASCII"),
            ("a%2F", "letters"),
        ];
        for (bad, why) in cases {
            let err = Name::new(bad).unwrap_err();
            let msg = err.to_string();
            assert!(msg.contains(why), "{bad:?}: {msg}");
            assert_eq!(err.kind(), crate::ErrorKind::Invalid);
        }
    }
}
