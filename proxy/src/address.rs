//! Which resolved addresses the proxy may connect to: public unicast only, unless an operator
//! range allows more. Pure: the proxy calls [`AddressPolicy::vet`] on every address a name
//! resolved to and connects only to what it returns.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

/// The decision on one address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressVerdict {
    /// Public unicast, or inside an operator range.
    Allowed,
    /// Refused; the class of address (`"loopback"`, `"private"`, …).
    Refused(&'static str),
}

/// No address the proxy would connect to; the first refused address and its class.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{address} is in a refused range ({class})")]
pub struct AddressRefusal {
    /// The first address refused.
    pub address: IpAddr,
    /// Its class.
    pub class: &'static str,
}

/// The addresses the proxy may connect to: every public unicast address, and those inside
/// one of the operator's ranges (`allow_addresses`, e.g. `10.1.2.0/24` for an internal
/// mirror, or `127.0.0.1/32` in tests).
///
/// Refused unless allowed: loopback, RFC 1918 private, shared address space (100.64.0.0/10),
/// link-local, multicast, broadcast, unspecified, `0.0.0.0/8`, the IETF, documentation,
/// benchmarking and reserved IPv4 ranges, IPv6 unique local (`fc00::/7`), site-local
/// (`fec0::/10`), IPv4-compatible (`::/96`), discard-only, Teredo, local-use NAT64, and
/// anything outside global unicast (`2000::/3`). Addresses that carry an IPv4 address are
/// judged by it: IPv4-mapped (`::ffff:a.b.c.d`), NAT64 (`64:ff9b::/96`) and 6to4
/// (`2002::/16`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AddressPolicy {
    allow: Vec<IpNet>,
}

impl AddressPolicy {
    /// A policy allowing, besides public unicast, the addresses inside `allow`.
    pub fn new(allow: Vec<IpNet>) -> AddressPolicy {
        AddressPolicy { allow }
    }

    /// The operator's ranges.
    pub fn allow(&self) -> &[IpNet] {
        &self.allow
    }

    /// Decides on one address. An operator range allows an address it contains, and an
    /// IPv4-mapped address whose IPv4 address it contains (the same host).
    pub fn check(&self, addr: IpAddr) -> AddressVerdict {
        let canonical = addr.to_canonical();
        if self
            .allow
            .iter()
            .any(|n| n.contains(&addr) || n.contains(&canonical))
        {
            return AddressVerdict::Allowed;
        }
        match address_class(addr) {
            Some(class) => AddressVerdict::Refused(class),
            None => AddressVerdict::Allowed,
        }
    }

    /// The allowed addresses of `addrs`, in order; an error naming the first refused one when
    /// none is allowed (when `addrs` is empty: `0.0.0.0`, `"unspecified"`).
    pub fn vet(&self, addrs: &[IpAddr]) -> Result<Vec<IpAddr>, AddressRefusal> {
        let mut first_refused = None;
        let mut allowed = Vec::new();
        for &a in addrs {
            match self.check(a) {
                AddressVerdict::Allowed => allowed.push(a),
                AddressVerdict::Refused(class) => {
                    first_refused.get_or_insert(AddressRefusal { address: a, class });
                }
            }
        }
        match (allowed.is_empty(), first_refused) {
            (false, _) => Ok(allowed),
            (true, Some(r)) => Err(r),
            (true, None) => Err(AddressRefusal {
                address: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                class: "unspecified",
            }),
        }
    }
}

/// The class of a non-public address, or `None` for public unicast.
pub fn address_class(addr: IpAddr) -> Option<&'static str> {
    match addr {
        IpAddr::V4(a) => v4_class(a),
        IpAddr::V6(a) => v6_class(a),
    }
}

/// Whether `a` is inside `net/len` (IPv4).
fn in_v4(a: Ipv4Addr, net: [u8; 4], len: u32) -> bool {
    let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
    u32::from(a) & mask == u32::from(Ipv4Addr::from(net)) & mask
}

/// Whether `a` is inside `net/len` (IPv6).
fn in_v6(a: Ipv6Addr, net: [u16; 8], len: u32) -> bool {
    let mask = u128::MAX.checked_shl(128 - len).unwrap_or(0);
    u128::from(a) & mask == u128::from(Ipv6Addr::from(net)) & mask
}

fn v4_class(a: Ipv4Addr) -> Option<&'static str> {
    const RANGES: &[([u8; 4], u32, &str)] = &[
        ([0, 0, 0, 0], 32, "unspecified"),
        ([0, 0, 0, 0], 8, "this-network (0.0.0.0/8)"),
        ([127, 0, 0, 0], 8, "loopback"),
        ([10, 0, 0, 0], 8, "private"),
        ([172, 16, 0, 0], 12, "private"),
        ([192, 168, 0, 0], 16, "private"),
        ([100, 64, 0, 0], 10, "shared (cgnat, 100.64.0.0/10)"),
        ([169, 254, 0, 0], 16, "link-local"),
        (
            [192, 0, 0, 0],
            24,
            "ietf protocol assignment (192.0.0.0/24)",
        ),
        ([192, 0, 2, 0], 24, "documentation"),
        ([198, 51, 100, 0], 24, "documentation"),
        ([203, 0, 113, 0], 24, "documentation"),
        ([192, 88, 99, 0], 24, "6to4 relay anycast (192.88.99.0/24)"),
        ([198, 18, 0, 0], 15, "benchmarking (198.18.0.0/15)"),
        ([224, 0, 0, 0], 4, "multicast"),
        ([255, 255, 255, 255], 32, "broadcast"),
        ([240, 0, 0, 0], 4, "reserved (240.0.0.0/4)"),
    ];
    RANGES
        .iter()
        .find(|(net, len, _)| in_v4(a, *net, *len))
        .map(|(_, _, class)| *class)
}

/// The IPv4 address in the low 32 bits.
fn low_v4(a: Ipv6Addr) -> Ipv4Addr {
    Ipv4Addr::from((u128::from(a) & 0xffff_ffff) as u32)
}

fn v6_class(a: Ipv6Addr) -> Option<&'static str> {
    if a.is_unspecified() {
        return Some("unspecified");
    }
    if a.is_loopback() {
        return Some("loopback");
    }
    if let Some(v4) = a.to_ipv4_mapped() {
        return v4_class(v4);
    }
    if in_v6(a, [0; 8], 96) {
        return Some("ipv4-compatible (::/96)");
    }
    if in_v6(a, [0x64, 0xff9b, 0, 0, 0, 0, 0, 0], 96) {
        return v4_class(low_v4(a));
    }
    if in_v6(a, [0x2002, 0, 0, 0, 0, 0, 0, 0], 16) {
        let bits = (u128::from(a) >> 80) as u32;
        return v4_class(Ipv4Addr::from(bits));
    }
    const RANGES: &[([u16; 8], u32, &str)] = &[
        (
            [0x64, 0xff9b, 1, 0, 0, 0, 0, 0],
            48,
            "local-use nat64 (64:ff9b:1::/48)",
        ),
        ([0x100, 0, 0, 0, 0, 0, 0, 0], 64, "discard-only (100::/64)"),
        ([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32, "documentation"),
        ([0x2001, 0, 0, 0, 0, 0, 0, 0], 32, "teredo (2001::/32)"),
        (
            [0x2001, 2, 0, 0, 0, 0, 0, 0],
            48,
            "benchmarking (2001:2::/48)",
        ),
        ([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7, "unique local (fc00::/7)"),
        ([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10, "link-local"),
        ([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10, "site-local (fec0::/10)"),
        ([0xff00, 0, 0, 0, 0, 0, 0, 0], 8, "multicast"),
    ];
    if let Some((_, _, class)) = RANGES.iter().find(|(net, len, _)| in_v6(a, *net, *len)) {
        return Some(class);
    }
    if !in_v6(a, [0x2000, 0, 0, 0, 0, 0, 0, 0], 3) {
        return Some("reserved (outside 2000::/3)");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn class(s: &str) -> Option<&'static str> {
        address_class(s.parse().unwrap())
    }

    /// Each of `refused` has its class, and each of `public` none.
    fn assert_classes(refused: &[(&str, &str)], public: &[&str]) {
        for (a, want) in refused {
            assert_eq!(class(a), Some(*want), "{a}");
        }
        for a in public {
            assert_eq!(class(a), None, "{a}");
        }
    }

    #[test]
    fn every_ipv4_class_is_refused() {
        let cases = [
            ("0.0.0.0", "unspecified"),
            ("0.1.2.3", "this-network (0.0.0.0/8)"),
            ("127.0.0.1", "loopback"),
            ("127.255.0.9", "loopback"),
            ("10.1.2.3", "private"),
            ("172.16.0.1", "private"),
            ("172.31.255.255", "private"),
            ("192.168.1.1", "private"),
            ("100.64.0.1", "shared (cgnat, 100.64.0.0/10)"),
            ("100.127.255.255", "shared (cgnat, 100.64.0.0/10)"),
            ("169.254.169.254", "link-local"),
            ("192.0.0.8", "ietf protocol assignment (192.0.0.0/24)"),
            ("192.0.2.1", "documentation"),
            ("198.51.100.1", "documentation"),
            ("203.0.113.1", "documentation"),
            ("198.19.0.1", "benchmarking (198.18.0.0/15)"),
            ("224.0.0.1", "multicast"),
            ("239.255.255.250", "multicast"),
            ("255.255.255.255", "broadcast"),
            ("240.0.0.1", "reserved (240.0.0.0/4)"),
        ];
        let public = [
            "1.1.1.1",
            "8.8.8.8",
            "172.32.0.1",
            "100.128.0.1",
            "192.169.0.1",
        ];
        assert_classes(&cases, &public);
    }

    #[test]
    fn every_ipv6_class_is_refused() {
        let cases = [
            ("::", "unspecified"),
            ("::1", "loopback"),
            ("::2", "ipv4-compatible (::/96)"),
            ("::7f00:1", "ipv4-compatible (::/96)"),
            ("64:ff9b:1::1", "local-use nat64 (64:ff9b:1::/48)"),
            ("100::1", "discard-only (100::/64)"),
            ("2001:db8::1", "documentation"),
            ("2001:0:4136:e378::1", "teredo (2001::/32)"),
            ("2001:2::1", "benchmarking (2001:2::/48)"),
            ("fc00::1", "unique local (fc00::/7)"),
            ("fd12:3456::1", "unique local (fc00::/7)"),
            ("fe80::1", "link-local"),
            ("febf::1", "link-local"),
            ("fec0::1", "site-local (fec0::/10)"),
            ("ff02::1", "multicast"),
            ("4000::1", "reserved (outside 2000::/3)"),
        ];
        let public = [
            "2606:4700:4700::1111",
            "2a00:1450:4001::1",
            "2001:4860::8888",
        ];
        assert_classes(&cases, &public);
    }

    #[test]
    fn embedded_ipv4_addresses_are_judged_by_the_ipv4_address() {
        assert_eq!(class("::ffff:127.0.0.1"), Some("loopback"));
        assert_eq!(class("::ffff:10.0.0.1"), Some("private"));
        assert_eq!(class("::ffff:8.8.8.8"), None);
        assert_eq!(class("64:ff9b::127.0.0.1"), Some("loopback"));
        assert_eq!(class("64:ff9b::169.254.169.254"), Some("link-local"));
        assert_eq!(class("64:ff9b::8.8.8.8"), None);
        assert_eq!(class("2002:7f00:1::1"), Some("loopback"));
        assert_eq!(class("2002:c0a8:101::1"), Some("private"));
        assert_eq!(class("2002:808:808::1"), None);
    }

    #[test]
    fn operator_ranges_allow_what_they_contain() {
        let p = AddressPolicy::new(vec![
            "127.0.0.1/32".parse().unwrap(),
            "fd00::/8".parse().unwrap(),
        ]);
        let check = |s: &str| p.check(s.parse().unwrap());
        assert_eq!(check("127.0.0.1"), AddressVerdict::Allowed);
        assert_eq!(check("::ffff:127.0.0.1"), AddressVerdict::Allowed);
        assert_eq!(check("127.0.0.2"), AddressVerdict::Refused("loopback"));
        assert_eq!(check("fd00::5"), AddressVerdict::Allowed);
        assert_eq!(
            check("fc00::5"),
            AddressVerdict::Refused("unique local (fc00::/7)")
        );
        assert_eq!(check("::1"), AddressVerdict::Refused("loopback"));
        assert_eq!(
            AddressPolicy::default().check("127.0.0.1".parse().unwrap()),
            AddressVerdict::Refused("loopback")
        );
    }

    #[test]
    fn vet_keeps_the_allowed_and_names_the_first_refusal() {
        let p = AddressPolicy::default();
        let addrs: Vec<IpAddr> = ["10.0.0.1", "8.8.8.8", "127.0.0.1", "1.1.1.1"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        assert_eq!(
            p.vet(&addrs).unwrap(),
            vec![
                "8.8.8.8".parse::<IpAddr>().unwrap(),
                "1.1.1.1".parse().unwrap()
            ]
        );
        let e = p.vet(&addrs[2..3]).unwrap_err();
        assert_eq!(e.class, "loopback");
        assert_eq!(e.to_string(), "127.0.0.1 is in a refused range (loopback)");
        assert_eq!(p.vet(&[]).unwrap_err().class, "unspecified");
    }
}
