//! The one rule for shortening text quoted in messages, errors and events: cut on a
//! character boundary and mark the cut with `…`. Escaping (for a terminal, for display) is
//! the caller's, done before or after as the message needs.

/// At most `max` characters of `s`; a `…` follows when anything was cut.
pub fn clip(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        None => s.to_owned(),
        Some((end, _)) => format!("{}…", &s[..end]),
    }
}

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
pub fn prefix_bytes(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// `s` on one line: every run of white space (newlines included) becomes one space, and
/// leading and trailing white space goes.
pub fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clip_counts_characters_and_marks_the_cut() {
        assert_eq!(clip("abc", 3), "abc");
        assert_eq!(clip("abcd", 3), "abc…");
        assert_eq!(clip("ééé", 2), "éé…");
        assert_eq!(clip("", 0), "");
        assert_eq!(clip("x", 0), "…");
    }

    #[test]
    fn prefix_bytes_never_splits_a_character() {
        assert_eq!(prefix_bytes("abc", 5), "abc");
        assert_eq!(prefix_bytes("aé", 2), "a");
        assert_eq!(prefix_bytes("aé", 3), "aé");
        assert_eq!(prefix_bytes("€", 2), "");
    }

    #[test]
    fn one_line_folds_white_space() {
        assert_eq!(one_line("  a\n\tb  c \r\n"), "a b c");
        assert_eq!(one_line("\n\n"), "");
    }
}
