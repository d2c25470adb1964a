//! The first bytes a client sends into a CONNECT tunnel: a TLS ClientHello's server name
//! (SNI), read with a bounds-checked parser that never panics, and the check that it names
//! the CONNECT host (no domain fronting: `CONNECT allowed.com` then `SNI evil.com`).
//!
//! Bytes that do not start like a TLS handshake record (`0x16 0x03`) are another protocol,
//! tunnelled as they are. A TLS ClientHello must be whole within [`MAX_HELLO`] bytes and well
//! formed; it may span several records.

use ollie_policy::domains::{Host, normalize_host};

/// The most bytes of a first flight the proxy holds back before deciding. A ClientHello,
/// even with post-quantum key shares, is a few KiB.
pub const MAX_HELLO: usize = 64 * 1024;

/// The largest TLS plaintext record (RFC 8446 §5.1).
const MAX_RECORD: usize = 16 * 1024;

/// What the first bytes of a tunnel are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FirstFlight {
    /// Not a TLS handshake: tunnel as is.
    NotTls,
    /// The start of a TLS handshake; more bytes are needed.
    Incomplete,
    /// A whole ClientHello; its host name, if it sent one.
    Hello {
        /// The `host_name` of the `server_name` extension, as sent (ASCII).
        server_name: Option<String>,
    },
    /// A TLS handshake that is not a well-formed ClientHello; why.
    Malformed(&'static str),
}

/// Whether a tunnel may go on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SniVerdict {
    /// Forward the first flight and tunnel.
    Pass,
    /// Close the tunnel; why, one line.
    Refuse(String),
}

/// A cursor over bytes whose every read is bounds-checked.
struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.buf.len() {
            return None;
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Some(head)
    }

    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }

    /// A vector with a one-byte length prefix.
    fn vec8(&mut self) -> Option<&'a [u8]> {
        let n = self.u8()?;
        self.take(usize::from(n))
    }

    /// A vector with a two-byte length prefix.
    fn vec16(&mut self) -> Option<&'a [u8]> {
        let n = self.u16()?;
        self.take(usize::from(n))
    }

    fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
}

/// Reads the first bytes a client sent into a tunnel. Never panics.
pub fn parse_first_flight(buf: &[u8]) -> FirstFlight {
    match buf {
        [] | [0x16] => return FirstFlight::Incomplete,
        [0x16, 0x03, ..] => {}
        _ => return FirstFlight::NotTls,
    }
    let mut handshake = Vec::new();
    let mut rest = buf;
    loop {
        let Some((header, after)) = rest.split_first_chunk::<5>() else {
            return FirstFlight::Incomplete;
        };
        if header[0] != 0x16 {
            return FirstFlight::Malformed("a record that is not a handshake inside the hello");
        }
        if header[1] != 0x03 {
            return FirstFlight::Malformed("a record with an unknown version");
        }
        let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
        if len == 0 || len > MAX_RECORD {
            return FirstFlight::Malformed("a record of a length tls does not allow");
        }
        let Some((body, next)) = after.split_at_checked(len) else {
            return FirstFlight::Incomplete;
        };
        handshake.extend_from_slice(body);
        rest = next;
        if let [kind, a, b, c, message @ ..] = handshake.as_slice() {
            if *kind != 1 {
                return FirstFlight::Malformed("the first handshake message is not a client hello");
            }
            let mlen = usize::from(*a) << 16 | usize::from(*b) << 8 | usize::from(*c);
            if mlen > MAX_HELLO {
                return FirstFlight::Malformed("the client hello is larger than 64 KiB");
            }
            if let Some(hello) = message.get(..mlen) {
                return parse_hello(hello);
            }
        }
    }
}

/// Reads a ClientHello message body (after its four-byte handshake header).
fn parse_hello(body: &[u8]) -> FirstFlight {
    match hello_server_name(body) {
        Some(Ok(server_name)) => FirstFlight::Hello { server_name },
        Some(Err(why)) => FirstFlight::Malformed(why),
        None => FirstFlight::Malformed("the client hello is truncated or its lengths disagree"),
    }
}

/// The server name of a ClientHello body: `None` when a length runs past the end.
fn hello_server_name(body: &[u8]) -> Option<Result<Option<String>, &'static str>> {
    let mut r = Reader { buf: body };
    r.take(2 + 32)?; // legacy_version, random
    if r.vec8()?.len() > 32 {
        return Some(Err(
            "the client hello has a session id longer than 32 bytes",
        ));
    }
    let suites = r.vec16()?;
    if suites.is_empty() || suites.len() % 2 != 0 {
        return Some(Err("the client hello has a malformed cipher suite list"));
    }
    if r.vec8()?.is_empty() {
        return Some(Err("the client hello has no compression method"));
    }
    if r.is_empty() {
        return Some(Ok(None));
    }
    let exts = r.vec16()?;
    if !r.is_empty() {
        return Some(Err("the client hello has bytes after its extensions"));
    }
    let two = "the client hello has two server_name extensions";
    match only_entry(exts, |r| r.u16(), 0, two)? {
        Ok(Some(data)) => server_name_extension(data),
        Ok(None) => Some(Ok(None)),
        Err(why) => Some(Err(why)),
    }
}

/// The data of the one entry of kind `want` in a list of (kind, two-byte-length data)
/// entries, whose kind `kind` reads; `two` when there are several. `None` when a length runs
/// past the end.
fn only_entry<'a>(
    list: &'a [u8],
    kind: impl Fn(&mut Reader<'a>) -> Option<u16>,
    want: u16,
    two: &'static str,
) -> Option<Result<Option<&'a [u8]>, &'static str>> {
    let mut r = Reader { buf: list };
    let mut found = None;
    while !r.is_empty() {
        let k = kind(&mut r)?;
        let data = r.vec16()?;
        if k != want {
            continue;
        }
        if found.is_some() {
            return Some(Err(two));
        }
        found = Some(data);
    }
    Some(Ok(found))
}

/// The `host_name` of a `server_name` extension's data.
fn server_name_extension(data: &[u8]) -> Option<Result<Option<String>, &'static str>> {
    let mut r = Reader { buf: data };
    let list = r.vec16()?;
    if !r.is_empty() {
        return Some(Err("the server_name extension has bytes after its list"));
    }
    let two = "the server_name extension names two hosts";
    let name = match only_entry(list, |r| r.u8().map(u16::from), 0, two)? {
        Ok(Some(name)) => name,
        Ok(None) => return Some(Ok(None)),
        Err(why) => return Some(Err(why)),
    };
    match std::str::from_utf8(name) {
        Ok(s) if !s.is_empty() && s.is_ascii() => Some(Ok(Some(s.to_string()))),
        _ => Some(Err("the server name is empty or not ascii")),
    }
}

/// Decides on a first flight (not [`FirstFlight::Incomplete`]) for a tunnel to `host`: other
/// protocols pass; a ClientHello must name `host` (after normalisation), or, for a tunnel to
/// an IP literal, may name none. A ClientHello to a name without a server name is refused.
pub fn check_sni(host: &Host, flight: &FirstFlight) -> SniVerdict {
    match flight {
        FirstFlight::NotTls => SniVerdict::Pass,
        FirstFlight::Incomplete => SniVerdict::Refuse("the tls client hello is incomplete".into()),
        FirstFlight::Malformed(why) => SniVerdict::Refuse(format!("malformed tls: {why}")),
        FirstFlight::Hello { server_name: None } => match host {
            Host::Ip(_) => SniVerdict::Pass,
            Host::Name(_) => SniVerdict::Refuse(format!(
                "the tls client hello names no server; it must name {host}"
            )),
        },
        FirstFlight::Hello {
            server_name: Some(sni),
        } => match normalize_host(sni) {
            Ok(h) if h == *host => SniVerdict::Pass,
            Ok(h) => SniVerdict::Refuse(format!(
                "the tls server name {h} is not the connect host {host} (domain fronting)"
            )),
            Err(e) => SniVerdict::Refuse(format!("the tls server name is not a host name: {e}")),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const CURL_EVIL: &[u8] = include_bytes!("../testdata/client_hello_curl_evil.test.bin");
    const CURL_ALLOWED: &[u8] = include_bytes!("../testdata/client_hello_curl_allowed.test.bin");

    fn with_len16(body: &[u8]) -> Vec<u8> {
        let mut v = u16::try_from(body.len()).unwrap().to_be_bytes().to_vec();
        v.extend_from_slice(body);
        v
    }

    /// A ClientHello body with the given extensions (`None`: no extension block at all).
    fn hello_body(exts: Option<&[(u16, Vec<u8>)]>) -> Vec<u8> {
        let mut b = vec![0x03, 0x03];
        b.extend_from_slice(&[7; 32]);
        b.push(0);
        b.extend(with_len16(&[0x13, 0x01]));
        b.extend_from_slice(&[1, 0]);
        if let Some(exts) = exts {
            let mut all = Vec::new();
            for (kind, data) in exts {
                all.extend_from_slice(&kind.to_be_bytes());
                all.extend(with_len16(data));
            }
            b.extend(with_len16(&all));
        }
        b
    }

    fn sni_ext(names: &[&str]) -> (u16, Vec<u8>) {
        let mut list = Vec::new();
        for n in names {
            list.push(0);
            list.extend(with_len16(n.as_bytes()));
        }
        (0, with_len16(&list))
    }

    /// Records of at most `chunk` bytes carrying the handshake message of `body`.
    fn records(body: &[u8], chunk: usize) -> Vec<u8> {
        let len = u32::try_from(body.len()).unwrap().to_be_bytes();
        let mut msg = vec![1, len[1], len[2], len[3]];
        msg.extend_from_slice(body);
        let mut out = Vec::new();
        for part in msg.chunks(chunk) {
            out.extend_from_slice(&[0x16, 0x03, 0x01]);
            out.extend(with_len16(part));
        }
        out
    }

    fn name(s: &str) -> Host {
        normalize_host(s).unwrap()
    }

    #[test]
    fn a_real_client_hello_from_curl_names_its_server() {
        assert_eq!(
            parse_first_flight(CURL_EVIL),
            FirstFlight::Hello {
                server_name: Some("evil.test".into())
            }
        );
        let allowed = parse_first_flight(CURL_ALLOWED);
        assert_eq!(check_sni(&name("allowed.test"), &allowed), SniVerdict::Pass);
        let v = check_sni(&name("allowed.test"), &parse_first_flight(CURL_EVIL));
        assert_eq!(
            v,
            SniVerdict::Refuse(
                "the tls server name evil.test is not the connect host allowed.test (domain fronting)"
                    .into()
            )
        );
    }

    #[test]
    fn every_truncation_is_incomplete_or_malformed_never_a_hello() {
        for fixture in [CURL_EVIL, CURL_ALLOWED] {
            for n in 0..fixture.len() {
                assert_eq!(
                    parse_first_flight(&fixture[..n]),
                    FirstFlight::Incomplete,
                    "{n}"
                );
            }
        }
    }

    #[test]
    fn a_hello_may_span_records_and_be_followed_by_more_bytes() {
        let body = hello_body(Some(&[
            (10, vec![0, 2, 0, 29]),
            sni_ext(&["Split.Example."]),
        ]));
        let mut bytes = records(&body, 7);
        let want = FirstFlight::Hello {
            server_name: Some("Split.Example.".into()),
        };
        assert_eq!(parse_first_flight(&bytes), want);
        assert_eq!(check_sni(&name("split.example"), &want), SniVerdict::Pass);
        bytes.extend_from_slice(&[0x14, 0x03, 0x03, 0, 1, 1]);
        assert_eq!(parse_first_flight(&bytes), want);
    }

    #[test]
    fn hellos_without_a_server_name() {
        for body in [
            hello_body(None),
            hello_body(Some(&[(10, vec![0, 2, 0, 29])])),
        ] {
            let f = parse_first_flight(&records(&body, 512));
            assert_eq!(f, FirstFlight::Hello { server_name: None });
            assert_eq!(check_sni(&name("127.0.0.1"), &f), SniVerdict::Pass);
            assert!(matches!(
                check_sni(&name("a.test"), &f),
                SniVerdict::Refuse(_)
            ));
        }
    }

    #[test]
    fn other_protocols_are_not_tls() {
        for b in [
            &b"GET / HTTP/1.1\r\n"[..],
            b"SSH-2.0-OpenSSH_9.2\r\n",
            b"\x16\x01",
            b"\x00",
        ] {
            assert_eq!(parse_first_flight(b), FirstFlight::NotTls, "{b:?}");
            assert_eq!(
                check_sni(&name("a.test"), &FirstFlight::NotTls),
                SniVerdict::Pass
            );
        }
    }

    #[test]
    fn malformed_hellos_are_refused() {
        let two = hello_body(Some(&[sni_ext(&["a.test"]), sni_ext(&["b.test"])]));
        let both = hello_body(Some(&[sni_ext(&["a.test", "b.test"])]));
        let bad_name = hello_body(Some(&[sni_ext(&["a\u{0}.test"])]));
        let empty = hello_body(Some(&[sni_ext(&[""])]));
        let mut trailing = hello_body(Some(&[sni_ext(&["a.test"])]));
        trailing.push(0);
        let mut short_ext = hello_body(None);
        short_ext.extend_from_slice(&[0, 9, 0, 0]);
        for body in [&two, &both, &empty, &trailing, &short_ext] {
            let f = parse_first_flight(&records(body, 16384));
            assert!(matches!(f, FirstFlight::Malformed(_)), "{f:?}");
            assert!(matches!(
                check_sni(&name("a.test"), &f),
                SniVerdict::Refuse(_)
            ));
        }
        let f = parse_first_flight(&records(&bad_name, 16384));
        assert_eq!(
            f,
            FirstFlight::Hello {
                server_name: Some("a\u{0}.test".into())
            }
        );
        assert!(matches!(
            check_sni(&name("a.test"), &f),
            SniVerdict::Refuse(_)
        ));
        // A record that is not a handshake, a zero-length record, a server hello.
        assert!(matches!(
            parse_first_flight(b"\x16\x03\x01\x00\x00"),
            FirstFlight::Malformed(_)
        ));
        let mut not_client = records(&hello_body(None), 512);
        not_client[5] = 2;
        assert!(matches!(
            parse_first_flight(&not_client),
            FirstFlight::Malformed(_)
        ));
        let mut alert_inside = records(&hello_body(None), 10);
        alert_inside[15] = 0x15;
        assert!(matches!(
            parse_first_flight(&alert_inside),
            FirstFlight::Malformed(_)
        ));
        // A handshake header claiming more than the bound.
        assert!(matches!(
            parse_first_flight(b"\x16\x03\x01\x00\x04\x01\xff\xff\xff"),
            FirstFlight::Malformed(_)
        ));
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = parse_first_flight(&bytes);
            let mut tls = vec![0x16, 0x03, 0x01];
            tls.extend_from_slice(&bytes);
            let _ = parse_first_flight(&tls);
        }

        #[test]
        fn mutated_curl_hellos_never_panic(i in 0..517usize, b in any::<u8>(), cut in 0..517usize) {
            let mut bytes = CURL_ALLOWED.to_vec();
            bytes[i] = b;
            let _ = parse_first_flight(&bytes);
            let _ = parse_first_flight(&bytes[..cut]);
        }
    }
}
