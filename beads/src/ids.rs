//! Version-4 UUIDs and random suffixes from the system RNG.

use crate::Error;

/// A new random (version 4, RFC 9562) UUID in lower-case canonical form.
pub fn new_uuid_v4() -> Result<String, Error> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).map_err(|source| Error::Random { source })?;
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let mut s = String::with_capacity(36);
    for (i, byte) in b.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        s.push_str(&format!("{byte:02x}"));
    }
    Ok(s)
}

/// Whether `s` is a UUID in canonical 8-4-4-4-12 hex form (either case).
pub fn is_uuid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, c)| {
            if matches!(i, 8 | 13 | 18 | 23) {
                *c == b'-'
            } else {
                c.is_ascii_hexdigit()
            }
        })
}

/// 16 random hex digits, for temporary file names.
pub(crate) fn random_suffix() -> Result<String, Error> {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).map_err(|source| Error::Random { source })?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_are_v4_and_distinct() {
        let a = new_uuid_v4().unwrap();
        let b = new_uuid_v4().unwrap();
        assert_ne!(a, b);
        assert!(is_uuid(&a), "{a}");
        assert_eq!(&a[14..15], "4");
        assert!(matches!(&a[19..20], "8" | "9" | "a" | "b"), "{a}");
        assert_eq!(a, a.to_lowercase());
        assert!(is_uuid("975f5db5-905e-42c4-8ec6-f3911a691374"));
        assert!(!is_uuid("975f5db5-905e-42c4-8ec6-f3911a69137"));
        assert!(!is_uuid("975f5db5x905e-42c4-8ec6-f3911a691374"));
        assert!(!is_uuid("plan9-beads"));
    }
}
