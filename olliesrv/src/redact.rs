//! The API keys this server has read, and their removal from what it shows and stores.
//!
//! A backend reads its key at each call ([`crate::backend`]); every key read is remembered
//! here, process-wide. Whatever olliesrv shows or stores (the chat, streamed or whole, the
//! history, error messages, `generate`) passes through [`redact`], which replaces each
//! remembered key by `<redacted>`. What runs is never redacted: the tool calls a model returns
//! are executed exactly as the model wrote them, and only their copies in the chat and the
//! history are redacted.
//!
//! Keys shorter than [`MIN_KEY_CHARS`] are refused where they are read, so that redaction
//! never cuts ordinary words out of text.
//!
//! [`MIN_KEY_CHARS`]: crate::redact::MIN_KEY_CHARS

use std::borrow::Cow;
use std::sync::RwLock;

use serde_json::Value;

/// The shortest API key accepted.
pub const MIN_KEY_CHARS: usize = 16;
/// What a key is replaced by.
pub const MARK: &str = "<redacted>";
/// Keys remembered at most (the oldest go first; keys are rotated rarely).
const MAX_KEYS: usize = 64;
/// The shortest cut-off end of a key that [`redact`] also removes from the end of a text (an
/// error message cut to its length may end inside a key).
const MIN_CUT_PREFIX: usize = 8;

static KEYS: RwLock<Vec<String>> = RwLock::new(Vec::new());

/// Remembers `key` (at least [`MIN_KEY_CHARS`] long; shorter ones are refused where read).
pub fn remember(key: &str) {
    if key.chars().count() < MIN_KEY_CHARS {
        return;
    }
    if KEYS
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .any(|k| k == key)
    {
        return;
    }
    let mut keys = KEYS.write().unwrap_or_else(|e| e.into_inner());
    if !keys.iter().any(|k| k == key) {
        if keys.len() >= MAX_KEYS {
            keys.remove(0);
        }
        keys.push(key.to_owned());
    }
}

fn keys() -> std::sync::RwLockReadGuard<'static, Vec<String>> {
    KEYS.read().unwrap_or_else(|e| e.into_inner())
}

/// `text` with every remembered key replaced by [`MARK`]; also a text cut short (ending with
/// `…`, as a cut error message does) right after the first [`MIN_CUT_PREFIX`] or more
/// characters of a key loses that end.
pub fn redact(text: &str) -> Cow<'_, str> {
    keys()
        .iter()
        .fold(Cow::Borrowed(text), |t, k| redact_key(t, k))
}

/// [`redact`] for the one key `key` (remembered or not).
pub fn redact_key<'a>(text: Cow<'a, str>, key: &str) -> Cow<'a, str> {
    let mut out = text;
    if key.is_empty() {
        return out;
    }
    if out.contains(key) {
        out = Cow::Owned(out.replace(key, MARK));
    }
    if let Some(body) = out.strip_suffix('…')
        && let Some(n) = (MIN_CUT_PREFIX..key.len())
            .rev()
            .filter(|n| key.is_char_boundary(*n))
            .find(|n| body.ends_with(&key[..*n]))
    {
        out = Cow::Owned(format!("{}{MARK}…", &body[..body.len() - n]));
    }
    out
}

/// [`redact`] applied to every string in `v`, at any depth (object keys included).
pub fn redact_json(v: &Value) -> Cow<'_, Value> {
    if keys().is_empty() {
        return Cow::Borrowed(v);
    }
    fn walk(v: &Value) -> Value {
        match v {
            Value::String(s) => Value::String(redact(s).into_owned()),
            Value::Array(a) => Value::Array(a.iter().map(walk).collect()),
            Value::Object(m) => Value::Object(
                m.iter()
                    .map(|(k, v)| (redact(k).into_owned(), walk(v)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }
    Cow::Owned(walk(v))
}

/// Redaction of a text that arrives in pieces (a streamed reply): a key split across two
/// pieces is still found, because the end of a piece that could begin a key is held back until
/// the next piece (or [`Stream::finish`]) shows whether it does.
#[derive(Debug, Default)]
pub struct Stream {
    held: String,
}

impl Stream {
    /// What of `held + piece` can be shown now, redacted.
    pub fn push(&mut self, piece: &str) -> String {
        self.held.push_str(piece);
        let keys = keys();
        if keys.is_empty() {
            return std::mem::take(&mut self.held);
        }
        let mut text = std::mem::take(&mut self.held);
        for k in keys.iter() {
            if text.contains(k.as_str()) {
                text = text.replace(k.as_str(), MARK);
            }
        }
        // The longest end of `text` that is the start of some key stays held.
        let hold = keys
            .iter()
            .filter_map(|k| {
                (1..k.len())
                    .rev()
                    .filter(|n| k.is_char_boundary(*n))
                    .find(|n| text.ends_with(&k[..*n]))
            })
            .max()
            .unwrap_or(0);
        self.held = text.split_off(text.len() - hold);
        text
    }

    /// The rest, at the end of the text.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // One key for this module's tests; keys are process-wide, so each test uses its own.
    const K1: &str = "sk-test-1234567890abcdef";
    const K2: &str = "sk-other-ABCDEFGHIJKLMNOP";
    const K3: &str = "key3-zyxwvutsrqponmlkji";

    #[test]
    fn short_keys_are_not_remembered() {
        remember("bk");
        remember("fifteen-chars-x");
        assert_eq!(
            redact("/home/bk/work fifteen-chars-x"),
            "/home/bk/work fifteen-chars-x"
        );
    }

    #[test]
    fn every_occurrence_and_a_cut_end_are_redacted() {
        remember(K1);
        assert_eq!(
            redact(&format!("a {K1} b {K1}")),
            "a <redacted> b <redacted>"
        );
        // An error message cut inside the key.
        assert_eq!(
            redact(&format!("bad key {}…", &K1[..12])),
            "bad key <redacted>…"
        );
        // Only a cut text loses a key's start; too short a piece stays.
        assert_eq!(
            redact(&format!("ends {}", &K1[..9])),
            format!("ends {}", &K1[..9])
        );
        assert_eq!(redact("sk-test…"), "sk-test…");
        assert_eq!(redact("nothing here"), "nothing here");
    }

    #[test]
    fn json_strings_are_redacted_at_any_depth() {
        remember(K2);
        let v = serde_json::json!({"a": [K2, 1, {"b": format!("x{K2}y")}], K2: true});
        let r = redact_json(&v).into_owned();
        assert!(!r.to_string().contains(K2), "{r}");
        assert_eq!(r["a"][2]["b"], "x<redacted>y");
        assert_eq!(r["a"][1], 1);
    }

    #[test]
    fn a_key_split_across_pieces_is_found() {
        remember(K3);
        let text = format!("the key is {K3}, the end");
        for cut in 0..text.len() {
            if !text.is_char_boundary(cut) {
                continue;
            }
            let mut s = Stream::default();
            let mut out = s.push(&text[..cut]);
            out.push_str(&s.push(&text[cut..]));
            out.push_str(&s.finish());
            assert_eq!(out, "the key is <redacted>, the end", "cut at {cut}");
        }
        // Text that only looks like the start of a key comes out whole at the end.
        let mut s = Stream::default();
        let mut out = s.push("ends with key3-zy");
        out.push_str(&s.finish());
        assert_eq!(out, "ends with key3-zy");
    }
}
