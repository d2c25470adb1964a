//! Domain rules for network egress through the session's proxy: host names as a proxy sees
//! them ([`normalize_host`]), the patterns a policy lists ([`DomainPattern`]), the decision
//! ([`DomainRules::decide`]) and the shipped presets ([`preset`]).
//!
//! Everything here is pure: no resolution, no I/O. A name is normalised exactly once, the same
//! way for a request and for a pattern, so that what is compared is what will be resolved:
//! ASCII lower case, one trailing dot dropped, internationalised labels turned into their
//! ASCII (punycode) form by UTS 46 (non-transitional), and IP literals turned into addresses.
//! Whatever could make two readers disagree about the name (a NUL byte, percent-encoding, user
//! info, a path, a port, an IP literal in a form only some resolvers read, a label mixing
//! look-alike scripts) is refused instead of being repaired.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use idna::AsciiDenyList;
use idna::uts46::{DnsLength, Hyphens, Uts46};

/// The longest name DNS carries, in bytes, without the trailing dot.
pub const MAX_NAME_LEN: usize = 253;

/// The longest label DNS carries, in bytes.
pub const MAX_LABEL_LEN: usize = 63;

/// Input longer than this is refused before any IDNA work (a name that long cannot shrink to
/// [`MAX_NAME_LEN`] without the invisible characters that are refused anyway).
const MAX_RAW_LEN: usize = 1024;

/// Every printable ASCII character but letters, digits, `-`, `.` and `_`: what no host name
/// may hold, before or after IDNA mapping. (Evaluated at compile time.)
const DENY: AsciiDenyList = AsciiDenyList::new(true, "!\"#$%&'()*+,/:;<=>?@[\\]^`{|}~");

/// A host as the proxy decides on it: a normalised name, or an IP address.
///
/// Only [`normalize_host`] makes one, so a `Name` is always lower-case ASCII of letters,
/// digits, `-`, `_` and `.`, with no trailing dot, at most [`MAX_NAME_LEN`] bytes, and never
/// an IP literal in any form.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    /// A DNS name, normalised (`xn--bcher-kva.example`).
    Name(String),
    /// An IP literal. IPv4-mapped IPv6 literals (`::ffff:127.0.0.1`) are the IPv4 address.
    Ip(IpAddr),
}

impl fmt::Display for Host {
    /// The name, the dotted IPv4 address, or the IPv6 address in brackets (`[::1]`), so that
    /// `{host}:{port}` reads right. [`normalize_host`] reads every form back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::Ip(IpAddr::V4(a)) => write!(f, "{a}"),
            Host::Ip(IpAddr::V6(a)) => write!(f, "[{a}]"),
        }
    }
}

/// Why a host name or a domain pattern was refused. Messages are one lowercase line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostError {
    /// Nothing (or only a dot) was given.
    #[error("the name is empty")]
    Empty,
    /// Longer than DNS allows.
    #[error("the name is {len} bytes long; at most 253 are allowed")]
    TooLong {
        /// Its length in bytes (of the input, or of its ASCII form).
        len: usize,
    },
    /// Two dots in a row, a leading dot, or more than one trailing dot.
    #[error("the name has an empty label (a leading dot, or two dots in a row)")]
    EmptyLabel,
    /// A label longer than DNS allows.
    #[error("a label of the name is {len} bytes long; at most 63 are allowed")]
    LabelTooLong {
        /// The label's length in bytes (of its ASCII form).
        len: usize,
    },
    /// A NUL byte, which C resolvers would read as the end of the name.
    #[error("the name contains a NUL byte")]
    Nul,
    /// A control character (C0, DEL or C1).
    #[error("the name contains a control character")]
    Control,
    /// White space of any kind; nothing is trimmed.
    #[error("the name contains white space")]
    Whitespace,
    /// A character that does not show (soft hyphen, zero-width space, bidi control, variation
    /// selector…), which UTS 46 would drop silently.
    #[error("the name contains an invisible character (U+{code:04X})")]
    Invisible {
        /// The character's code point.
        code: u32,
    },
    /// Percent-encoding or an IPv6 zone id.
    #[error("the name contains '%' (percent-encoding and zone ids are not host names)")]
    Percent,
    /// User info (`user@host`).
    #[error("the name contains '@' (user info is not part of a host name)")]
    At,
    /// A path.
    #[error("the name contains '/' (a path is not part of a host name)")]
    Slash,
    /// A backslash, which some URL parsers read as `/`.
    #[error("the name contains '\\' (a path is not part of a host name)")]
    Backslash,
    /// A port, or an IPv6 literal that does not parse.
    #[error(
        "the name contains ':' (a port is not part of a host name; an ipv6 literal goes in brackets)"
    )]
    Colon,
    /// A wildcard in a host name.
    #[error("the name contains '*' (a wildcard is valid only as a pattern's leading '*.')")]
    Star,
    /// Any other ASCII character a host name cannot hold.
    #[error("the name contains {ch:?}; a host name holds only letters, digits, '-', '_' and '.'")]
    Character {
        /// The character.
        ch: char,
    },
    /// UTS 46 processing refused the name (a disallowed code point, bad punycode, …).
    #[error("the name is not a valid internationalised domain name (uts 46)")]
    Idna,
    /// A label mixing letters of look-alike scripts (Latin, Greek, Cyrillic, Armenian,
    /// Cherokee), as in a homograph (`pаypal` with a Cyrillic `а`).
    #[error("the label {label:?} mixes letters of different scripts")]
    MixedScript {
        /// The label in Unicode.
        label: String,
    },
    /// A name every resolver reads as an IPv4 address, but not written as a canonical dotted
    /// quad (`127.1`, `0x7f.1`, `2130706433`, `0177.0.0.1`).
    #[error(
        "the name is an ip literal in a non-canonical form; write it as a dotted quad such as 127.0.0.1"
    )]
    NonCanonicalIp,
    /// A bracketed literal that is not an IPv6 address.
    #[error("the bracketed literal is not an ipv6 address")]
    BadIpv6,
    /// A pattern with a `*` anywhere but as its whole first label.
    #[error("a '*' may only stand as the whole first label of a pattern, as in *.example.com")]
    WildcardPlacement,
    /// A wildcard over a top-level domain, or over everything.
    #[error(
        "the pattern {pattern} is too broad: a wildcard needs at least two labels after it, as in *.example.com"
    )]
    TooBroad {
        /// The pattern as written (normalised).
        pattern: String,
    },
    /// A wildcard before an IP address.
    #[error("a wildcard cannot stand before an ip address")]
    WildcardIp,
}

/// Normalises a host as a request names it: the one form every rule is matched against and
/// the proxy resolves.
///
/// ASCII is lower-cased and one trailing dot dropped; internationalised names become their
/// ASCII form (UTS 46, non-transitional: `bücher.example` → `xn--bcher-kva.example`); dotted
/// IPv4 literals, and IPv6 literals bare or in brackets, become [`Host::Ip`]. Nothing is
/// trimmed: every [`HostError`] is a refusal, including IPv4 literals in a form only some
/// resolvers read (`127.1`, `0x7f.0.0.1`, `2130706433`, `0177.0.0.1`: any name whose last
/// label is a number), and labels mixing look-alike scripts. `_` is allowed inside labels.
///
/// Never panics, on any input.
pub fn normalize_host(raw: &str) -> Result<Host, HostError> {
    if raw.is_empty() {
        return Err(HostError::Empty);
    }
    if raw.len() > MAX_RAW_LEN {
        return Err(HostError::TooLong { len: raw.len() });
    }
    if let Some(inner) = raw.strip_prefix('[') {
        let inner = inner.strip_suffix(']').ok_or(HostError::BadIpv6)?;
        check_chars(inner, true)?;
        let a: Ipv6Addr = inner.parse().map_err(|_| HostError::BadIpv6)?;
        return Ok(Host::Ip(IpAddr::V6(a).to_canonical()));
    }
    if raw.contains(':') {
        check_chars(raw, true)?;
        let a: Ipv6Addr = raw.parse().map_err(|_| HostError::Colon)?;
        return Ok(Host::Ip(IpAddr::V6(a).to_canonical()));
    }
    check_chars(raw, false)?;
    let lower = raw.to_ascii_lowercase();
    let ascii = Uts46::new()
        .to_ascii(lower.as_bytes(), DENY, Hyphens::Allow, DnsLength::Ignore)
        .map_err(|_| HostError::Idna)?;
    // The mapping can produce characters the input did not hold (U+2100 is "a/c").
    check_chars(&ascii, false)?;
    let name = ascii.strip_suffix('.').unwrap_or(&ascii);
    if name.is_empty() {
        return Err(HostError::Empty);
    }
    if name.len() > MAX_NAME_LEN {
        return Err(HostError::TooLong { len: name.len() });
    }
    for label in name.split('.') {
        if label.is_empty() {
            return Err(HostError::EmptyLabel);
        }
        if label.len() > MAX_LABEL_LEN {
            return Err(HostError::LabelTooLong { len: label.len() });
        }
    }
    if ends_in_number(name) {
        let a: Ipv4Addr = name.parse().map_err(|_| HostError::NonCanonicalIp)?;
        return Ok(Host::Ip(IpAddr::V4(a)));
    }
    if !name.is_ascii() || name.bytes().any(|b| b.is_ascii_uppercase()) {
        // UTS 46 output is lower-case ASCII; anything else is not a name we can compare.
        return Err(HostError::Idna);
    }
    check_scripts(name)?;
    Ok(Host::Name(name.to_string()))
}

/// Refuses the characters no host may hold, naming the first one found. `v6` is set for the
/// inside of an IPv6 literal, where `:` is expected.
fn check_chars(s: &str, v6: bool) -> Result<(), HostError> {
    for c in s.chars() {
        let refused = match c {
            '\0' => HostError::Nul,
            c if c.is_control() => HostError::Control,
            c if c.is_whitespace() => HostError::Whitespace,
            c if is_invisible(c) => HostError::Invisible { code: c as u32 },
            '%' => HostError::Percent,
            '@' => HostError::At,
            '/' => HostError::Slash,
            '\\' => HostError::Backslash,
            ':' if v6 => continue,
            ':' => HostError::Colon,
            '*' => HostError::Star,
            c if c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_') => continue,
            c if c.is_ascii() => HostError::Character { ch: c },
            _ => continue,
        };
        return Err(refused);
    }
    Ok(())
}

/// Format characters and selectors that UTS 46 maps to nothing or that do not show: soft
/// hyphen, Arabic letter mark, Mongolian vowel separator, zero-width and bidi controls, word
/// joiners, variation selectors, the byte-order mark, and the tag characters.
fn is_invisible(c: char) -> bool {
    matches!(
        c as u32,
        0xAD | 0x34F
            | 0x61C
            | 0x115F..=0x1160
            | 0x17B4..=0x17B5
            | 0x180B..=0x180F
            | 0x200B..=0x200F
            | 0x202A..=0x202E
            | 0x2060..=0x206F
            | 0x3164
            | 0xFE00..=0xFE0F
            | 0xFEFF
            | 0xFFA0
            | 0xFFF0..=0xFFF8
            | 0x1BCA0..=0x1BCA3
            | 0xE0000..=0xE0FFF
    )
}

/// The WHATWG URL standard's "ends in a number": the last label is all decimal digits, or
/// `0x` followed by hex digits. Such a name is an IPv4 literal to every URL parser and to
/// `inet_aton`, never a DNS name (no top-level domain is numeric).
fn ends_in_number(name: &str) -> bool {
    let last = name.rsplit('.').next().unwrap_or(name);
    if !last.is_empty() && last.bytes().all(|b| b.is_ascii_digit()) {
        return true;
    }
    match last.strip_prefix("0x") {
        Some(hex) => hex.bytes().all(|b| b.is_ascii_hexdigit()),
        None => false,
    }
}

/// The scripts whose letters look alike enough to spell one name in another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Script {
    Latin,
    Greek,
    Cyrillic,
    Armenian,
    Cherokee,
}

/// Which look-alike script `c` is a letter of, if any. Digits, `-`, `_` and every other script
/// (Han, kana, Arabic, …) count as none: mixing those with Latin is ordinary.
fn script_of(c: char) -> Option<Script> {
    match c as u32 {
        0x41..=0x5A
        | 0x61..=0x7A
        | 0xC0..=0x24F
        | 0x1E00..=0x1EFF
        | 0x2C60..=0x2C7F
        | 0xA720..=0xA7FF
        | 0xAB30..=0xAB6F => Some(Script::Latin),
        0x370..=0x3FF | 0x1F00..=0x1FFF => Some(Script::Greek),
        0x400..=0x52F | 0x1C80..=0x1C8F | 0x2DE0..=0x2DFF | 0xA640..=0xA69F => {
            Some(Script::Cyrillic)
        }
        0x531..=0x58F => Some(Script::Armenian),
        0x13A0..=0x13FF | 0xAB70..=0xABBF => Some(Script::Cherokee),
        _ => None,
    }
}

/// Refuses a label (in its Unicode form) that holds letters of two look-alike scripts.
fn check_scripts(ascii: &str) -> Result<(), HostError> {
    if !ascii.contains("xn--") {
        return Ok(());
    }
    let (unicode, result) = idna::domain_to_unicode(ascii);
    if result.is_err() {
        return Err(HostError::Idna);
    }
    for label in unicode.split('.') {
        let mut seen: Option<Script> = None;
        for s in label.chars().filter_map(script_of) {
            match seen {
                Some(prev) if prev != s => {
                    return Err(HostError::MixedScript {
                        label: label.to_string(),
                    });
                }
                _ => seen = Some(s),
            }
        }
    }
    Ok(())
}

/// What a pattern matches.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Kind {
    /// This name exactly.
    Exact(String),
    /// Any name strictly below this one (`*.example.com`: not `example.com` itself).
    Below(String),
    /// This address literal only.
    Ip(IpAddr),
}

/// One entry of an allow or deny list: `example.com` (that name exactly), `*.example.com`
/// (any name strictly below `example.com`, at any depth, but not `example.com` itself), or an
/// IP literal (`127.0.0.1`, `::1`, `[::1]`: a request naming that address literally).
///
/// Patterns are normalised as hosts are ([`normalize_host`]), so `PyPI.org.` is `pypi.org`.
/// [`Display`](fmt::Display) writes the normalised form, which parses back to the same
/// pattern.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DomainPattern {
    kind: Kind,
}

impl DomainPattern {
    /// Parses a pattern. Refused besides every [`HostError`] of a host: a `*` anywhere but as
    /// the whole first label, `*` alone, a wildcard over one label (`*.com`), and a wildcard
    /// before an IP address.
    pub fn parse(s: &str) -> Result<DomainPattern, HostError> {
        if s == "*" || s == "*." {
            return Err(HostError::TooBroad {
                pattern: "*".to_string(),
            });
        }
        let (wild, rest) = match s.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, s),
        };
        if rest.contains('*') {
            return Err(HostError::WildcardPlacement);
        }
        let kind = match (wild, normalize_host(rest)?) {
            (false, Host::Name(n)) => Kind::Exact(n),
            (false, Host::Ip(a)) => Kind::Ip(a),
            (true, Host::Ip(_)) => return Err(HostError::WildcardIp),
            (true, Host::Name(n)) if !n.contains('.') => {
                return Err(HostError::TooBroad {
                    pattern: format!("*.{n}"),
                });
            }
            (true, Host::Name(n)) => Kind::Below(n),
        };
        Ok(DomainPattern { kind })
    }

    /// Whether `host` is one this pattern names. A name never matches an IP pattern, nor an
    /// address a name pattern.
    pub fn matches(&self, host: &Host) -> bool {
        match (&self.kind, host) {
            (Kind::Exact(p), Host::Name(n)) => p == n,
            (Kind::Below(p), Host::Name(n)) => n
                .strip_suffix(p.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
            (Kind::Ip(p), Host::Ip(a)) => p == a,
            _ => false,
        }
    }

    /// Whether this is a wildcard (`*.example.com`).
    pub fn is_wildcard(&self) -> bool {
        matches!(self.kind, Kind::Below(_))
    }
}

impl fmt::Display for DomainPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Exact(n) => f.write_str(n),
            Kind::Below(n) => write!(f, "*.{n}"),
            Kind::Ip(a) => write!(f, "{a}"),
        }
    }
}

impl std::str::FromStr for DomainPattern {
    type Err = HostError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DomainPattern::parse(s)
    }
}

/// The decision on one host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DomainVerdict {
    /// An allow pattern matched and no deny pattern did; the pattern, as displayed.
    Allowed(String),
    /// A deny pattern matched (deny wins over allow); the pattern, as displayed.
    Denied(String),
    /// No pattern matched: the caller decides (ask a human, or refuse).
    NotListed,
}

/// The allow and deny lists of a session's network egress.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DomainRules {
    allow: Vec<DomainPattern>,
    deny: Vec<DomainPattern>,
}

impl DomainRules {
    /// Rules from parsed patterns.
    pub fn new(allow: Vec<DomainPattern>, deny: Vec<DomainPattern>) -> DomainRules {
        DomainRules { allow, deny }
    }

    /// Decides on a normalised host: the first matching deny pattern wins, then the first
    /// matching allow pattern; otherwise [`DomainVerdict::NotListed`]. An IP literal is not
    /// listed unless an allow pattern is that literal.
    pub fn decide(&self, host: &Host) -> DomainVerdict {
        if let Some(p) = self.deny.iter().find(|p| p.matches(host)) {
            return DomainVerdict::Denied(p.to_string());
        }
        match self.allow.iter().find(|p| p.matches(host)) {
            Some(p) => DomainVerdict::Allowed(p.to_string()),
            None => DomainVerdict::NotListed,
        }
    }

    /// The allow patterns, in order.
    pub fn allow(&self) -> &[DomainPattern] {
        &self.allow
    }

    /// The deny patterns, in order.
    pub fn deny(&self) -> &[DomainPattern] {
        &self.deny
    }
}

/// The shipped presets, by name: the hosts each package manager or service needs, and only
/// those (no wildcard where the real hosts are known).
const PRESETS: &[(&str, &[&str])] = &[
    (
        "pypi",
        &[
            // pip, uv, poetry: the simple index and the JSON API.
            "pypi.org",
            // The distribution files the index links to.
            "files.pythonhosted.org",
        ],
    ),
    (
        "npm",
        &[
            // npm, pnpm and yarn 2+ by default.
            "registry.npmjs.org",
            // yarn 1's default registry (the same registry behind another name).
            "registry.yarnpkg.com",
        ],
    ),
    (
        "crates",
        &[
            // cargo: the web API (search, publish, the download redirect).
            "crates.io",
            // cargo's sparse index (the default since Rust 1.70).
            "index.crates.io",
            // The `.crate` files the download redirect points to.
            "static.crates.io",
        ],
    ),
    (
        "rustup",
        &[
            // rustup: toolchains, components and its own updates.
            "static.rust-lang.org",
        ],
    ),
    (
        "go",
        &[
            // The go command's default GOPROXY (modules, and toolchains for GOTOOLCHAIN).
            "proxy.golang.org",
            // The go command's default GOSUMDB, the checksum database.
            "sum.golang.org",
        ],
    ),
    (
        "github",
        &[
            // git over HTTPS, release pages.
            "github.com",
            // The REST and GraphQL APIs (gh, release look-ups).
            "api.github.com",
            // Source archives (`/archive/…tar.gz`), as go, cargo and npm fetch them.
            "codeload.github.com",
            // Raw files (`raw.githubusercontent.com/OWNER/REPO/REF/PATH`).
            "raw.githubusercontent.com",
            // Release assets: the older and the newer download host.
            "objects.githubusercontent.com",
            "release-assets.githubusercontent.com",
        ],
    ),
];

/// The names [`preset`] knows, in the order they are documented.
pub const PRESET_NAMES: &[&str] = &["pypi", "npm", "crates", "rustup", "go", "github"];

/// The patterns of a shipped preset (`pypi`, `npm`, `crates`, `rustup`, `go`, `github`), or
/// `None` for another name. Each entry parses as a [`DomainPattern`].
pub fn preset(name: &str) -> Option<&'static [&'static str]> {
    PRESETS.iter().find(|(n, _)| *n == name).map(|(_, p)| *p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn name(s: &str) -> Host {
        Host::Name(s.to_string())
    }

    fn ip(s: &str) -> Host {
        Host::Ip(s.parse().unwrap())
    }

    fn pat(s: &str) -> DomainPattern {
        DomainPattern::parse(s).unwrap()
    }

    #[test]
    fn names_are_lower_cased_and_lose_one_trailing_dot() {
        assert_eq!(normalize_host("ALLOWED.COM."), Ok(name("allowed.com")));
        assert_eq!(normalize_host("Allowed.Com"), Ok(name("allowed.com")));
        assert_eq!(normalize_host("allowed.com.."), Err(HostError::EmptyLabel));
        assert_eq!(normalize_host(".allowed.com"), Err(HostError::EmptyLabel));
        assert_eq!(normalize_host("a..b"), Err(HostError::EmptyLabel));
        assert_eq!(normalize_host("localhost"), Ok(name("localhost")));
        assert_eq!(
            normalize_host("_dmarc.x-y.example"),
            Ok(name("_dmarc.x-y.example"))
        );
    }

    #[test]
    fn empty_and_overlong_names_are_refused() {
        assert_eq!(normalize_host(""), Err(HostError::Empty));
        assert_eq!(normalize_host("."), Err(HostError::Empty));
        let label = "a".repeat(63);
        assert_eq!(
            normalize_host(&format!("{label}.com")),
            Ok(name(&format!("{label}.com")))
        );
        assert_eq!(
            normalize_host(&format!("a{label}.com")),
            Err(HostError::LabelTooLong { len: 64 })
        );
        let long = vec!["a".repeat(50); 5].join(".");
        assert_eq!(long.len(), 254);
        assert_eq!(normalize_host(&long), Err(HostError::TooLong { len: 254 }));
        assert!(normalize_host(&format!("{}.", &long[1..])).is_ok());
        let huge = "a".repeat(5000);
        assert_eq!(normalize_host(&huge), Err(HostError::TooLong { len: 5000 }));
    }

    #[test]
    fn every_refused_character_class_is_named() {
        let cases: &[(&str, HostError)] = &[
            ("attacker\u{0}.allowed.com", HostError::Nul),
            ("allowed.com\u{0}", HostError::Nul),
            ("allowed.com%00.evil", HostError::Percent),
            ("user@allowed.com", HostError::At),
            ("allowed.com/x", HostError::Slash),
            ("allowed.com\\x", HostError::Backslash),
            ("allowed.com:443", HostError::Colon),
            ("*.allowed.com", HostError::Star),
            (" allowed.com", HostError::Whitespace),
            ("allowed.com ", HostError::Whitespace),
            ("allowed\u{3000}com", HostError::Whitespace),
            ("allowed.com\n", HostError::Control),
            ("allowed\u{7f}.com", HostError::Control),
            ("allowed\u{85}.com", HostError::Control),
            ("allo\u{ad}wed.com", HostError::Invisible { code: 0xAD }),
            ("allowed\u{200b}.com", HostError::Invisible { code: 0x200B }),
            ("allowed.com\u{202e}", HostError::Invisible { code: 0x202E }),
            ("allowed.com\u{fe0f}", HostError::Invisible { code: 0xFE0F }),
            ("allowed!.com", HostError::Character { ch: '!' }),
            ("allowed.com#x", HostError::Character { ch: '#' }),
            ("allowed.com?x", HostError::Character { ch: '?' }),
            ("[allowed.com]", HostError::BadIpv6),
        ];
        for (input, want) in cases {
            assert_eq!(normalize_host(input).as_ref(), Err(want), "{input:?}");
        }
    }

    #[test]
    fn messages_are_one_lowercase_line() {
        let errors = [
            normalize_host("attacker\u{0}.allowed.com").unwrap_err(),
            normalize_host("allowed.com%00.evil").unwrap_err(),
            normalize_host("127.1").unwrap_err(),
            DomainPattern::parse("*.com").unwrap_err(),
        ];
        assert_eq!(errors[0].to_string(), "the name contains a NUL byte");
        for e in errors {
            let m = e.to_string();
            assert!(!m.contains('\n'), "{m}");
            assert!(m.starts_with(|c: char| c.is_lowercase()), "{m}");
        }
        assert_eq!(
            DomainPattern::parse("*.com").unwrap_err().to_string(),
            "the pattern *.com is too broad: a wildcard needs at least two labels after it, as in *.example.com"
        );
    }

    #[test]
    fn internationalised_names_become_punycode() {
        assert_eq!(
            normalize_host("bücher.example"),
            Ok(name("xn--bcher-kva.example"))
        );
        assert_eq!(
            normalize_host("BÜCHER.example."),
            Ok(name("xn--bcher-kva.example"))
        );
        assert_eq!(
            normalize_host("xn--bcher-kva.example"),
            Ok(name("xn--bcher-kva.example"))
        );
        // Non-transitional: ß stays (xn--zca), it is not mapped to "ss".
        assert_eq!(normalize_host("ß.example"), Ok(name("xn--zca.example")));
        // Fullwidth forms map as every resolver-facing parser maps them.
        assert_eq!(
            normalize_host("ｅｘａｍｐｌｅ．com"),
            Ok(name("example.com"))
        );
        assert_eq!(
            normalize_host("例え.テスト"),
            Ok(name("xn--r8jz45g.xn--zckzah"))
        );
    }

    #[test]
    fn invalid_or_mixed_script_idna_is_refused() {
        // Invalid punycode, and punycode that decodes to plain ASCII.
        assert_eq!(normalize_host("xn--zz.example"), Err(HostError::Idna));
        assert_eq!(normalize_host("xn--abc-.example"), Err(HostError::Idna));
        // A code point UTS 46 disallows.
        assert_eq!(normalize_host("a\u{2ff0}b.example"), Err(HostError::Idna));
        // Latin with a Cyrillic 'а' (U+0430), as Unicode and as punycode.
        let homograph = "p\u{430}ypal.com";
        assert!(matches!(
            normalize_host(homograph),
            Err(HostError::MixedScript { .. })
        ));
        let puny = idna::domain_to_ascii(homograph).unwrap();
        assert!(matches!(
            normalize_host(&puny),
            Err(HostError::MixedScript { .. })
        ));
        // Greek with Cyrillic.
        assert!(matches!(
            normalize_host("\u{3b1}\u{431}.example"),
            Err(HostError::MixedScript { .. })
        ));
        // One script per label is fine, and so is Latin next to Han.
        assert!(normalize_host("пример.рф").is_ok());
        assert!(normalize_host("abc例え.jp").is_ok());
        // A mapping that yields a character a host cannot hold (U+2100 is "a/c").
        assert!(normalize_host("\u{2100}.example").is_err());
    }

    #[test]
    fn ip_literals_become_addresses() {
        assert_eq!(normalize_host("127.0.0.1"), Ok(ip("127.0.0.1")));
        assert_eq!(normalize_host("127.0.0.1."), Ok(ip("127.0.0.1")));
        assert_eq!(normalize_host("::1"), Ok(ip("::1")));
        assert_eq!(normalize_host("[::1]"), Ok(ip("::1")));
        assert_eq!(normalize_host("[2001:DB8::1]"), Ok(ip("2001:db8::1")));
        assert_eq!(normalize_host("::ffff:127.0.0.1"), Ok(ip("127.0.0.1")));
        assert_eq!(normalize_host("[::ffff:7f00:1]"), Ok(ip("127.0.0.1")));
        assert_eq!(normalize_host("１２７.0.0.1"), Ok(ip("127.0.0.1")));
        assert_eq!(ip("::1").to_string(), "[::1]");
        assert_eq!(normalize_host(&ip("::1").to_string()), Ok(ip("::1")));
    }

    #[test]
    fn non_canonical_ipv4_forms_are_refused() {
        for s in [
            "0x7f.1",
            "127.1",
            "2130706433",
            "0177.0.0.1",
            "127.0.0.01",
            "0x7f000001",
            "1.2.3.4.5",
            "256.0.0.1",
            "example.123",
            "example.0x",
            "0X7F.0.0.1",
        ] {
            assert_eq!(normalize_host(s), Err(HostError::NonCanonicalIp), "{s}");
        }
        // A numeric label that is not the last one is an ordinary name.
        assert_eq!(normalize_host("123.example"), Ok(name("123.example")));
        assert_eq!(normalize_host("example.0x1g"), Ok(name("example.0x1g")));
    }

    #[test]
    fn bad_ipv6_literals_are_refused() {
        assert_eq!(normalize_host("[::1"), Err(HostError::BadIpv6));
        assert_eq!(normalize_host("[::1]:443"), Err(HostError::BadIpv6));
        assert_eq!(normalize_host("[fe80::1%eth0]"), Err(HostError::Percent));
        assert_eq!(normalize_host("[127.0.0.1]"), Err(HostError::BadIpv6));
        assert_eq!(normalize_host("::1::2"), Err(HostError::Colon));
        assert_eq!(normalize_host("[::1\u{0}]"), Err(HostError::Nul));
    }

    #[test]
    fn exact_patterns_match_that_name_only() {
        let p = pat("PyPI.org.");
        assert_eq!(p.to_string(), "pypi.org");
        assert!(p.matches(&name("pypi.org")));
        assert!(!p.matches(&name("www.pypi.org")));
        assert!(!p.matches(&name("evilpypi.org")));
        assert!(!p.matches(&name("pypi.org.evil")));
        let a = pat("allowed.com");
        assert!(!a.matches(&name("evilallowed.com")));
    }

    #[test]
    fn wildcards_match_strictly_below_and_not_the_apex() {
        let p = pat("*.allowed.com");
        assert_eq!(p.to_string(), "*.allowed.com");
        assert!(p.is_wildcard());
        assert!(p.matches(&name("a.allowed.com")));
        assert!(p.matches(&name("a.b.c.allowed.com")));
        assert!(!p.matches(&name("allowed.com")));
        assert!(!p.matches(&name("evilallowed.com")));
        assert!(!p.matches(&name(".allowed.com")));
        assert!(!p.matches(&ip("127.0.0.1")));
        assert!(pat("*.co.uk").matches(&name("x.co.uk")));
    }

    #[test]
    fn bad_patterns_are_refused() {
        assert!(matches!(
            DomainPattern::parse("*"),
            Err(HostError::TooBroad { .. })
        ));
        assert!(matches!(
            DomainPattern::parse("*.com"),
            Err(HostError::TooBroad { .. })
        ));
        assert!(matches!(
            DomainPattern::parse("*.ORG."),
            Err(HostError::TooBroad { .. })
        ));
        for s in [
            "a.*.com",
            "*a.example.com",
            "*.*.example.com",
            "example.*",
            "**.example.com",
        ] {
            assert_eq!(
                DomainPattern::parse(s),
                Err(HostError::WildcardPlacement),
                "{s}"
            );
        }
        assert_eq!(
            DomainPattern::parse("*.127.0.0.1"),
            Err(HostError::WildcardIp)
        );
        assert_eq!(DomainPattern::parse("*.[::1]"), Err(HostError::WildcardIp));
        assert_eq!(DomainPattern::parse("user@x.com"), Err(HostError::At));
        assert_eq!(
            DomainPattern::parse("127.1"),
            Err(HostError::NonCanonicalIp)
        );
        assert_eq!(DomainPattern::parse(""), Err(HostError::Empty));
    }

    #[test]
    fn ip_patterns_match_that_literal_only() {
        for s in ["127.0.0.1", "::1", "[::1]", "::ffff:127.0.0.1"] {
            let p = pat(s);
            assert_eq!(pat(&p.to_string()), p, "{s}");
        }
        assert!(pat("127.0.0.1").matches(&ip("127.0.0.1")));
        assert!(pat("127.0.0.1").matches(&normalize_host("::ffff:127.0.0.1").unwrap()));
        assert!(!pat("127.0.0.1").matches(&ip("127.0.0.2")));
        assert!(pat("[::1]").matches(&ip("::1")));
        assert!(!pat("::1").matches(&name("localhost")));
    }

    #[test]
    fn deny_wins_over_allow() {
        let rules = DomainRules::new(
            vec![pat("*.corp.test"), pat("good.corp.test")],
            vec![pat("*.bad.corp.test"), pat("good.corp.test")],
        );
        let decide = |s: &str| rules.decide(&name(s));
        assert_eq!(
            decide("x.bad.corp.test"),
            DomainVerdict::Denied("*.bad.corp.test".into())
        );
        assert_eq!(
            decide("good.corp.test"),
            DomainVerdict::Denied("good.corp.test".into())
        );
        assert_eq!(
            decide("ok.corp.test"),
            DomainVerdict::Allowed("*.corp.test".into())
        );
        assert_eq!(
            decide("bad.corp.test"),
            DomainVerdict::Allowed("*.corp.test".into())
        );
        assert_eq!(decide("corp.test"), DomainVerdict::NotListed);
        assert_eq!(decide("other.example"), DomainVerdict::NotListed);
        assert_eq!(
            DomainRules::default().decide(&name("x.test")),
            DomainVerdict::NotListed
        );
    }

    #[test]
    fn ip_literals_are_not_listed_unless_allowed_literally() {
        let rules = DomainRules::new(vec![pat("*.corp.test"), pat("10.0.0.1")], vec![pat("::1")]);
        assert_eq!(rules.decide(&ip("127.0.0.1")), DomainVerdict::NotListed);
        assert_eq!(
            rules.decide(&ip("10.0.0.1")),
            DomainVerdict::Allowed("10.0.0.1".into())
        );
        assert_eq!(
            rules.decide(&ip("::1")),
            DomainVerdict::Denied("::1".into())
        );
        let mapped = normalize_host("::ffff:127.0.0.1").unwrap();
        assert_eq!(rules.decide(&mapped), DomainVerdict::NotListed);
        let both = DomainRules::new(vec![pat("127.0.0.1")], vec![pat("127.0.0.1")]);
        assert_eq!(
            both.decide(&mapped),
            DomainVerdict::Denied("127.0.0.1".into())
        );
    }

    #[test]
    fn every_preset_entry_parses() {
        assert_eq!(PRESET_NAMES.len(), PRESETS.len());
        for name in PRESET_NAMES {
            let entries = preset(name).unwrap_or_else(|| panic!("preset {name} is missing"));
            assert!(!entries.is_empty(), "{name}");
            for e in entries {
                let p = DomainPattern::parse(e).unwrap_or_else(|err| panic!("{name}: {e}: {err}"));
                assert_eq!(p.to_string(), *e, "{name}: entries are written normalised");
            }
        }
        assert_eq!(preset("nope"), None);
        assert!(preset("pypi").unwrap().contains(&"files.pythonhosted.org"));
    }

    fn tricky() -> impl Strategy<Value = String> {
        let pieces = prop_oneof![
            Just("a".to_string()),
            Just("Z".to_string()),
            Just(".".to_string()),
            Just("*".to_string()),
            Just(":".to_string()),
            Just("[".to_string()),
            Just("]".to_string()),
            Just("%".to_string()),
            Just("0x".to_string()),
            Just("1".to_string()),
            Just("ü".to_string()),
            Just("xn--".to_string()),
            Just("\u{0}".to_string()),
            Just("\u{200d}".to_string()),
            Just("\u{430}".to_string()),
            Just("ｅ".to_string()),
            any::<char>().prop_map(String::from),
        ];
        proptest::collection::vec(pieces, 0..24).prop_map(|v| v.concat())
    }

    proptest! {
        #[test]
        fn normalize_never_panics_and_is_idempotent(s in prop_oneof![any::<String>(), tricky()]) {
            if let Ok(h) = normalize_host(&s) {
                prop_assert_eq!(normalize_host(&h.to_string()), Ok(h.clone()));
                if let Host::Name(n) = &h {
                    prop_assert!(n.len() <= MAX_NAME_LEN);
                    prop_assert!(n.bytes().all(|b| b.is_ascii_lowercase()
                        || b.is_ascii_digit() || matches!(b, b'-' | b'.' | b'_')));
                }
            }
        }

        #[test]
        fn patterns_round_trip(s in prop_oneof![any::<String>(), tricky()]) {
            for input in [s.clone(), format!("*.{s}")] {
                if let Ok(p) = DomainPattern::parse(&input) {
                    prop_assert_eq!(DomainPattern::parse(&p.to_string()), Ok(p.clone()));
                }
            }
        }
    }
}
