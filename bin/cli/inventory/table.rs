//! Tables sized to their content: each column as wide as its widest cell
//! (a 43-character name, or `live,cordoned`, no longer shifts every column
//! after it), the last one unpadded.

/// A table being filled; printed at once, once every width is known.
pub(super) struct Table {
    rows: Vec<Row>,
}

enum Row {
    Cells(Vec<String>),
    /// A first cell, then free text that spans the rest (a record that
    /// cannot be read, named with why).
    Spanning(String, String),
}

/// Between columns.
const GAP: &str = "  ";

impl Table {
    pub(super) fn new(header: &[&str]) -> Self {
        Table {
            rows: vec![Row::Cells(header.iter().map(|h| h.to_string()).collect())],
        }
    }

    pub(super) fn row(&mut self, cells: Vec<String>) {
        self.rows.push(Row::Cells(cells));
    }

    pub(super) fn spanning(&mut self, first: &str, rest: String) {
        self.rows.push(Row::Spanning(first.to_string(), rest));
    }

    /// The table as lines, without trailing spaces.
    pub(super) fn render(&self) -> Vec<String> {
        let mut widths: Vec<usize> = Vec::new();
        for r in &self.rows {
            let cells: Vec<&str> = match r {
                Row::Cells(c) => c.iter().map(String::as_str).collect(),
                Row::Spanning(first, _) => vec![first.as_str()],
            };
            for (i, c) in cells.iter().enumerate() {
                let w = c.chars().count();
                match widths.get_mut(i) {
                    Some(x) => *x = (*x).max(w),
                    None => widths.push(w),
                }
            }
        }
        self.rows
            .iter()
            .map(|r| {
                let line = match r {
                    Row::Cells(c) => {
                        let last = c.len().saturating_sub(1);
                        c.iter()
                            .enumerate()
                            .map(|(i, cell)| {
                                if i == last {
                                    cell.clone()
                                } else {
                                    format!("{cell:<w$}", w = widths[i])
                                }
                            })
                            .collect::<Vec<_>>()
                            .join(GAP)
                    }
                    Row::Spanning(first, rest) => {
                        format!("{first:<w$}{GAP}{rest}", w = widths[0])
                    }
                };
                line.trim_end().to_string()
            })
            .collect()
    }

    pub(super) fn print(&self) {
        for l in self.render() {
            println!("{l}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_fit_their_widest_cell_and_a_long_one_shifts_nothing_after_it() {
        let mut t = Table::new(&["NAME", "STATUS", "REASON"]);
        t.row(vec!["web".into(), "running".into(), "".into()]);
        t.row(vec![
            "a-very-long-session-name-of-forty-three-chars".into(),
            "queued".into(),
            "no node".into(),
        ]);
        t.spanning("bad", "CORRUPT: not a claim".into());
        let lines = t.render();
        let at = |l: &str, w: &str| l.find(w).unwrap();
        // STATUS starts at the same column on every row.
        let col = at(&lines[0], "STATUS");
        assert_eq!(at(&lines[1], "running"), col);
        assert_eq!(at(&lines[2], "queued"), col);
        assert_eq!(at(&lines[3], "CORRUPT"), col);
        assert_eq!(
            col,
            "a-very-long-session-name-of-forty-three-chars".len() + GAP.len()
        );
        // No trailing spaces (an empty last cell).
        assert!(lines.iter().all(|l| !l.ends_with(' ')), "{lines:?}");
    }
}
