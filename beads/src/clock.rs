//! UTC dates without a date crate: the dated kind folders and `created` stamps.

use std::time::{SystemTime, UNIX_EPOCH};

/// Today's UTC date as `YYYY-MM-DD`, the name of the dated kind-folder set new files go to.
pub fn utc_today() -> String {
    let (y, m, d, ..) = split(now_secs());
    format!("{y:04}-{m:02}-{d:02}")
}

/// Now as RFC 3339 UTC with second precision (`2026-06-11T09:30:00Z`).
pub(crate) fn utc_now_rfc3339() -> String {
    let (y, m, d, hh, mm, ss) = split(now_secs());
    format!("{y:04}-{m:02}-{d:02}T{hh:02}:{mm:02}:{ss:02}Z")
}

/// Whether `name` looks like a dated folder (`YYYY-MM-DD`, digits, month 01–12, day 01–31).
pub(crate) fn is_date_name(name: &str) -> bool {
    let b = name.as_bytes();
    if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
        return false;
    }
    let digits = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_digit);
    if !(digits(0..4) && digits(5..7) && digits(8..10)) {
        return false;
    }
    let month = (b[5] - b'0') * 10 + (b[6] - b'0');
    let day = (b[8] - b'0') * 10 + (b[9] - b'0');
    (1..=12).contains(&month) && (1..=31).contains(&day)
}

fn now_secs() -> i64 {
    // A clock before 1970 is treated as 1970 rather than failing.
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX / 2))
        .unwrap_or(0)
}

fn split(secs: i64) -> (i64, u32, u32, i64, i64, i64) {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    (y, m, d, rem / 3600, rem % 3600 / 60, rem % 60)
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates_are_right() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        // 2026-06-11 is day 20615.
        assert_eq!(civil_from_days(20_615), (2026, 6, 11));
        assert_eq!(split(20_615 * 86_400 + 3_723), (2026, 6, 11, 1, 2, 3));
    }

    #[test]
    fn today_is_a_date_name() {
        assert!(is_date_name(&utc_today()));
        assert!(utc_now_rfc3339().ends_with('Z'));
        assert!(is_date_name("2026-06-11"));
        for bad in [
            "2026-6-11",
            "2026-13-01",
            "2026-06-00",
            "abcd-ef-gh",
            "2026-06-11x",
            "",
        ] {
            assert!(!is_date_name(bad), "{bad}");
        }
    }
}
