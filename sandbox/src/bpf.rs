//! The default seccomp profile compiled as a binary search over syscall-number ranges instead
//! of seccompiler's linear chain, for the prepared (per-call) and one-shot spawn paths.
//!
//! Same rules, same actions: the allowed numbers are `seccomp.rs`'s groups, and the
//! argument-filtered calls (ioctl, clone, unshare, personality, the set-id mode rules, the
//! send flags and addresses, SIGCONT in the signal calls, socketpair, bind, socket: TCP for
//! `Network::Tcp`, TCP and UDP for
//! `Network::All`) and the other errnos (clone3 and openat2: ENOSYS; allocating fallocate:
//! EOPNOTSUPP) are re-expressed here. [`equivalent`] runs both programs through a small classic-BPF
//! interpreter over every syscall number (and argument probes for the filtered calls); the
//! test suite does so for every shipped profile and pins the result ([`PROVEN`]), a prepared
//! sandbox does so once per process for any other policy, and the reference programs are
//! attached whenever a pair is not shown equivalent ([`programs`]). A filter of ~350
//! instructions whose every path is at most ~20 instructions long costs the kernel a fraction
//! of the ~1365-instruction chain to attach (JIT and the per-syscall action cache both scale
//! with the instructions walked): about 0.5 ms of a one-shot run.

use crate::seccomp::{
    self, CLONE_NEWTIME, CLONE_NS_FLAGS, CREATE_FLAGS, FALLOCATE_FREEING, INET_ADDR_LENS,
    MSG_FASTOPEN, NetFilter, SETID_BITS, TIOCLINUX, TIOCSTI,
};
use libc::sock_filter;
use ollie_policy::Network;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

const AUDIT_ARCH_X86_64: u32 = 0xC000_003E;
const RET_KILL_PROCESS: u32 = 0x8000_0000;
const RET_ERRNO: u32 = 0x0005_0000;
const RET_ALLOW: u32 = 0x7fff_0000;
const LD_W_ABS: u16 = 0x20;
const JEQ_K: u16 = 0x15;
const JGE_K: u16 = 0x35;
const JSET_K: u16 = 0x45;
const AND_K: u16 = 0x54;
const RET_K: u16 = 0x06;
/// Syscall numbers considered (x86_64 tops out well below).
const MAX_NR: u32 = 1024;

fn ins(code: u16, jt: u8, jf: u8, k: u32) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

fn ret(k: u32) -> sock_filter {
    ins(RET_K, 0, 0, k)
}

fn ld_arg_lo(i: u32) -> sock_filter {
    ins(LD_W_ABS, 0, 0, 16 + 8 * i)
}

const EPERM: u32 = RET_ERRNO | libc::EPERM as u32;
const ENOSYS: u32 = RET_ERRNO | libc::ENOSYS as u32;
const EOPNOTSUPP: u32 = RET_ERRNO | libc::EOPNOTSUPP as u32;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Allow,
    Deny,
    Ioctl,
    Clone,
    Unshare,
    Personality,
    Socketpair,
    /// `socket(2)` under `Network::Tcp` and `Network::Proxy`: TCP over IPv4/IPv6.
    Socket,
    /// `socket(2)` under `Network::All`: TCP and UDP over IPv4/IPv6.
    SocketAll,
    /// ENOSYS (clone3, openat2).
    NoSys,
    /// Denied when the mode argument at this index carries set-id bits.
    Mode(u8),
    /// `open`/`openat`: denied when the flags (first index) create and the mode (second)
    /// carries set-id bits.
    OpenMode(u8, u8),
    /// Denied when the flags argument at this index carries `MSG_FASTOPEN`.
    SendFlags(u8),
    /// `sendto` without a destination address (flags 3, address length 5).
    SendToNoAddress,
    /// `bind` with an inet address length.
    Bind,
    /// `fallocate`: EOPNOTSUPP unless the mode frees space.
    Fallocate,
    /// A call that sends a signal: denied when the signal argument at this index is SIGCONT.
    NotSigcont(u8),
}

fn classes(network: &Network, deny: &BTreeSet<i64>) -> Vec<Class> {
    let net = NetFilter::of(network);
    let mut c = vec![Class::Deny; MAX_NR as usize];
    let groups = seccomp::BASE_GROUPS.into_iter().chain([net.inet_calls()]);
    let socket = match network {
        Network::Off => None,
        Network::Tcp { .. } | Network::Proxy(_) => Some(Class::Socket),
        Network::All => Some(Class::SocketAll),
    };
    for g in groups {
        for (_, nr) in g.iter() {
            if let Some(slot) = usize::try_from(*nr).ok().and_then(|i| c.get_mut(i)) {
                *slot = Class::Allow;
            }
        }
    }
    let mut set = |nr: i64, class| {
        if let Some(slot) = usize::try_from(nr).ok().and_then(|i| c.get_mut(i)) {
            *slot = class;
        }
    };
    set(libc::SYS_ioctl, Class::Ioctl);
    set(libc::SYS_clone, Class::Clone);
    set(libc::SYS_unshare, Class::Unshare);
    set(libc::SYS_personality, Class::Personality);
    set(libc::SYS_socketpair, Class::Socketpair);
    set(libc::SYS_clone3, Class::NoSys);
    set(libc::SYS_openat2, Class::NoSys);
    set(libc::SYS_fallocate, Class::Fallocate);
    for (nr, arg) in seccomp::MODE_ARGS {
        set(*nr, Class::Mode(*arg));
    }
    for (nr, flags, mode) in seccomp::OPEN_ARGS {
        set(*nr, Class::OpenMode(*flags, *mode));
    }
    for (nr, flags) in seccomp::SEND_FLAGS {
        set(*nr, Class::SendFlags(*flags));
    }
    for (nr, sig) in seccomp::SIGNAL_ARGS {
        set(*nr, Class::NotSigcont(*sig));
    }
    set(
        libc::SYS_sendto,
        if net.sendto_address() {
            Class::SendFlags(3)
        } else {
            Class::SendToNoAddress
        },
    );
    if net.binds() {
        set(libc::SYS_bind, Class::Bind);
    }
    if let Some(class) = socket {
        set(libc::SYS_socket, class);
    }
    // What the policy takes out (`syscalls.deny`).
    for nr in deny {
        set(*nr, Class::Deny);
    }
    c
}

/// Allowed when argument `arg` carries none of `bits`, else EPERM.
fn none_of_bits(arg: u8, bits: u64) -> [sock_filter; 4] {
    [
        ld_arg_lo(u32::from(arg)),
        ins(JSET_K, 1, 0, bits as u32),
        ret(RET_ALLOW),
        ret(EPERM),
    ]
}

/// Allowed when argument `arg` is one of `values`, else `otherwise`.
fn one_of(arg: u32, values: [u64; 2], otherwise: u32) -> [sock_filter; 5] {
    [
        ld_arg_lo(arg),
        ins(JEQ_K, 1, 0, values[0] as u32),
        ins(JEQ_K, 0, 1, values[1] as u32),
        ret(RET_ALLOW),
        ret(otherwise),
    ]
}

fn leaf(class: Class, out: &mut Vec<sock_filter>) {
    match class {
        Class::Allow => out.push(ret(RET_ALLOW)),
        Class::Deny => out.push(ret(EPERM)),
        Class::NoSys => out.push(ret(ENOSYS)),
        Class::Ioctl => out.extend([
            ld_arg_lo(1),
            ins(JEQ_K, 2, 0, TIOCSTI as u32),
            ins(JEQ_K, 1, 0, TIOCLINUX as u32),
            ret(RET_ALLOW),
            ret(EPERM),
        ]),
        Class::Clone | Class::Unshare => {
            let mask = if class == Class::Clone {
                CLONE_NS_FLAGS
            } else {
                CLONE_NS_FLAGS | CLONE_NEWTIME
            };
            out.extend([
                ld_arg_lo(0),
                ins(JSET_K, 1, 0, mask as u32),
                ret(RET_ALLOW),
                ret(EPERM),
            ])
        }
        Class::Personality => out.extend([
            ld_arg_lo(0),
            ins(JEQ_K, 2, 0, 0),
            ins(JEQ_K, 1, 0, 0xffff_ffff),
            ret(EPERM),
            ret(RET_ALLOW),
        ]),
        Class::Mode(arg) => out.extend(none_of_bits(arg, SETID_BITS)),
        Class::OpenMode(flags, mode) => out.extend([
            // 0: creating?
            ld_arg_lo(u32::from(flags)),
            ins(JSET_K, 1, 0, CREATE_FLAGS as u32),
            ret(RET_ALLOW),
            // 3: then no set-id bits in the mode
            ld_arg_lo(u32::from(mode)),
            ins(JSET_K, 1, 0, SETID_BITS as u32),
            ret(RET_ALLOW),
            ret(EPERM),
        ]),
        Class::SendFlags(arg) => out.extend(none_of_bits(arg, MSG_FASTOPEN)),
        Class::NotSigcont(arg) => out.extend([
            ld_arg_lo(u32::from(arg)),
            ins(JEQ_K, 1, 0, libc::SIGCONT as u32),
            ret(RET_ALLOW),
            ret(EPERM),
        ]),
        Class::SendToNoAddress => out.extend([
            // 0: flags
            ld_arg_lo(3),
            ins(JSET_K, 2, 0, MSG_FASTOPEN as u32),
            // 2: address length 0
            ld_arg_lo(5),
            ins(JEQ_K, 1, 0, 0),
            // 4, 5
            ret(EPERM),
            ret(RET_ALLOW),
        ]),
        Class::Bind => out.extend(one_of(2, INET_ADDR_LENS, EPERM)),
        Class::Fallocate => out.extend(one_of(1, FALLOCATE_FREEING, EOPNOTSUPP)),
        Class::Socketpair => out.extend([
            // 0: AF_UNIX
            ld_arg_lo(0),
            ins(JEQ_K, 0, 5, libc::AF_UNIX as u32),
            // 2: type & 0xf: stream or seqpacket
            ld_arg_lo(1),
            ins(AND_K, 0, 0, 0xf),
            ins(JEQ_K, 1, 0, libc::SOCK_STREAM as u32),
            ins(JEQ_K, 0, 1, libc::SOCK_SEQPACKET as u32),
            // 6, 7
            ret(RET_ALLOW),
            ret(EPERM),
        ]),
        Class::Socket => out.extend([
            ld_arg_lo(0),
            ins(JEQ_K, 1, 0, libc::AF_INET as u32),
            ins(JEQ_K, 0, 6, libc::AF_INET6 as u32),
            ld_arg_lo(1),
            ins(AND_K, 0, 0, 0xf),
            ins(JEQ_K, 0, 3, libc::SOCK_STREAM as u32),
            ld_arg_lo(2),
            ins(JEQ_K, 2, 0, 0),
            ins(JEQ_K, 1, 0, libc::IPPROTO_TCP as u32),
            ret(EPERM),
            ret(RET_ALLOW),
        ]),
        Class::SocketAll => out.extend([
            // 0: family
            ld_arg_lo(0),
            ins(JEQ_K, 1, 0, libc::AF_INET as u32),
            ins(JEQ_K, 0, 10, libc::AF_INET6 as u32),
            // 3: type & 0xf (kept in A for the datagram test at 9)
            ld_arg_lo(1),
            ins(AND_K, 0, 0, 0xf),
            ins(JEQ_K, 0, 3, libc::SOCK_STREAM as u32),
            // 6: stream: protocol 0 or TCP
            ld_arg_lo(2),
            ins(JEQ_K, 6, 0, 0),
            ins(JEQ_K, 5, 4, libc::IPPROTO_TCP as u32),
            // 9: datagram: protocol 0 or UDP
            ins(JEQ_K, 0, 3, libc::SOCK_DGRAM as u32),
            ld_arg_lo(2),
            ins(JEQ_K, 2, 0, 0),
            ins(JEQ_K, 1, 0, libc::IPPROTO_UDP as u32),
            // 13, 14
            ret(EPERM),
            ret(RET_ALLOW),
        ]),
    }
}

/// `ranges[i] = (first nr, class)`, covering `[ranges[i].0, ranges[i+1].0)`; the last one
/// extends to `u32::MAX` (x32 numbers land there: denied).
fn tree(ranges: &[(u32, Class)], out: &mut Vec<sock_filter>) -> Option<()> {
    if ranges.len() == 1 {
        leaf(ranges[0].1, out);
        return Some(());
    }
    let mid = ranges.len() / 2;
    let at = out.len();
    out.push(ins(JGE_K, 0, 0, ranges[mid].0));
    tree(&ranges[..mid], out)?;
    out[at].jt = u8::try_from(out.len() - at - 1).ok()?;
    tree(&ranges[mid..], out)
}

/// Compiles the default profile for `network` as one program (the other errnos folded in).
/// `None` if a jump would not fit (never for the shipped groups; the caller then uses the
/// reference programs).
pub(crate) fn compile(network: &Network, deny: &BTreeSet<i64>) -> Option<Vec<sock_filter>> {
    let classes = classes(network, deny);
    let mut ranges: Vec<(u32, Class)> = Vec::new();
    for (nr, class) in classes.iter().enumerate() {
        match ranges.last() {
            Some((_, last)) if last == class && !is_special(*class) => {}
            _ => ranges.push((nr as u32, *class)),
        }
    }
    // Numbers past the table are denied.
    if ranges.last().is_some_and(|(_, c)| *c != Class::Deny) {
        ranges.push((MAX_NR, Class::Deny));
    }
    let mut out = vec![
        ins(LD_W_ABS, 0, 0, 4),
        ins(JEQ_K, 1, 0, AUDIT_ARCH_X86_64),
        ret(RET_KILL_PROCESS),
        ins(LD_W_ABS, 0, 0, 0),
    ];
    tree(&ranges, &mut out)?;
    (out.len() <= 4096).then_some(out)
}

fn is_special(c: Class) -> bool {
    !matches!(c, Class::Allow | Class::Deny)
}

/// SHA-256 ([`seccomp::program_hash`]) of a range-tree program followed by the reference
/// programs it stands for: the key of an equivalence verdict.
fn pair_digest(fast: &[sock_filter], reference: &[Vec<sock_filter>]) -> String {
    seccomp::program_hash(std::iter::once(fast).chain(reference.iter().map(Vec::as_slice)))
}

/// The pairs (range tree, reference) that `tests::proven_pairs_are_equivalent_and_listed`
/// proves with [`equivalent`] on every test run: each network shape (every shipped profile)
/// with no denied calls, and with only `memfd_create` denied (a run without a memory cgroup,
/// [`crate::spawn::tool_deny`]). A listed pair skips the check at run time (about 60 ms,
/// too much for a one-shot run); a change to either compiler changes the digests, so the pair
/// is checked again (or the reference used) until the test proves it and the list is updated.
const PROVEN: [&str; 10] = [
    // Network::Off
    "afc42201e67122220be64b9a6a28660437a703eacfd1aa9fde3bd1145ce23ede",
    // Network::Tcp, connect only
    "08907309d16c3ea872f63fb80a9ce6c3266ac7c1691c4649a66821f47c259adc",
    // Network::Tcp, connect and bind
    "66461cf299e1b0147b7ac5e6160837ba6bd5646c412c469b172996100f66368b",
    // Network::All
    "d816f41ecc089d0eceac08b91ac0d308610696221970825872b1c341ea294adb",
    // Network::Proxy: the connect-only filter (its network namespace and Landlock's one
    // connect port do the rest)
    "08907309d16c3ea872f63fb80a9ce6c3266ac7c1691c4649a66821f47c259adc",
    // The same five without memfd_create (no memory cgroup): Off, connect, connect and bind,
    // All, Proxy
    "f7858d34eb4a785dce4e4288976f5b22b13081ae9b3acbd20c3a1fd9f279cac2",
    "7a4111f97bafd4f666b30c4eba659dc90dbea7589fb59cec815a71c7c9c7c4ff",
    "3a6ba8a8f636f933a479893e8577da247583132a94e453e9fb8049c18972e350",
    "e4d11fb0efe292368b1dc12955d232be08c6d8e6883438e32061b903f11c176c",
    "7a4111f97bafd4f666b30c4eba659dc90dbea7589fb59cec815a71c7c9c7c4ff",
];

/// What to do with a pair neither proven nor checked before in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unproven {
    /// Check it (once per process; a prepared sandbox lives for a session).
    Check,
    /// Install the reference programs (a one-shot run does not wait for the check).
    Reference,
}

/// The seccomp programs to install for `network` and the denied calls `deny`, with their run
/// record and layout (`"range-tree"` or `"reference"`): the range tree when its pair is
/// proven or was checked equivalent in this process, else the reference programs.
pub(crate) fn programs(
    network: &Network,
    deny: &BTreeSet<String>,
    unproven: Unproven,
) -> Result<(Vec<Vec<sock_filter>>, seccomp::SeccompRecord, &'static str), seccomp::SeccompError> {
    static CHECKED: Mutex<BTreeMap<String, bool>> = Mutex::new(BTreeMap::new());
    let reference = seccomp::filters(network, deny)?;
    let reference_programs: Vec<Vec<sock_filter>> = reference
        .programs
        .iter()
        .map(seccomp::to_sock_filters)
        .collect();
    let fast = seccomp::denied_numbers(deny)
        .ok()
        .and_then(|nrs| compile(network, &nrs));
    let verdict = fast.as_ref().and_then(|f| {
        let key = pair_digest(f, &reference_programs);
        if PROVEN.contains(&key.as_str()) {
            return Some(true);
        }
        if let Some(v) = CHECKED.lock().ok()?.get(&key) {
            return Some(*v);
        }
        if unproven == Unproven::Reference {
            return None;
        }
        let v = equivalent(f, &reference_programs);
        if let Ok(mut m) = CHECKED.lock()
            && m.len() < 64
        {
            // Bounded: a process sees a handful of policies.
            m.insert(key, v);
        }
        Some(v)
    });
    let (programs, layout) = match (fast, verdict) {
        (Some(f), Some(true)) => (vec![f], "range-tree"),
        _ => (reference_programs, "reference"),
    };
    let record = seccomp::SeccompRecord {
        hash: seccomp::program_hash(&programs),
        filters: programs.len(),
        instructions: programs.iter().map(Vec::len).sum(),
        ..reference.record
    };
    Ok((programs, record, layout))
}

/// Runs a classic-BPF seccomp program on `data` (the 64-byte `seccomp_data`), and says
/// whether it read a syscall argument. `None` for an instruction this interpreter does not
/// know or a jump out of the program.
pub(crate) fn interpret(prog: &[sock_filter], data: &[u8; 64]) -> Option<(u32, bool)> {
    let mut a: u32 = 0;
    let mut pc = 0usize;
    let mut reads_args = false;
    loop {
        let i = prog.get(pc)?;
        pc += 1;
        match i.code {
            LD_W_ABS => {
                let k = i.k as usize;
                reads_args |= k >= 16;
                let b = data.get(k..k + 4)?;
                a = u32::from_ne_bytes([b[0], b[1], b[2], b[3]]);
            }
            AND_K => a &= i.k,
            RET_K => return Some((i.k, reads_args)),
            // ja
            0x05 => pc += i.k as usize,
            JEQ_K | JGE_K | 0x25 | JSET_K => {
                let t = match i.code {
                    JEQ_K => a == i.k,
                    JGE_K => a >= i.k,
                    0x25 => a > i.k,
                    _ => a & i.k != 0,
                };
                pc += usize::from(if t { i.jt } else { i.jf });
            }
            _ => return None,
        }
    }
}

fn data(arch: u32, nr: u32, args: [u64; 6]) -> [u8; 64] {
    let mut d = [0u8; 64];
    d[..4].copy_from_slice(&nr.to_ne_bytes());
    d[4..8].copy_from_slice(&arch.to_ne_bytes());
    for (i, a) in args.iter().enumerate() {
        d[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_ne_bytes());
    }
    d
}

/// The kernel's combination of several filters: the most restrictive action wins (by the
/// action's precedence), the most recently installed among equals.
fn combined(programs: &[Vec<sock_filter>], d: &[u8; 64]) -> Option<(u32, bool)> {
    let rank = |r: u32| match r & 0xffff_0000 {
        0x8000_0000 => 0,
        0 => 1,
        0x0003_0000 => 2,
        0x0005_0000 => 3,
        0x7fc0_0000 => 4,
        0x7ff0_0000 => 5,
        0x7ffc_0000 => 6,
        _ => 7,
    };
    let mut best: Option<u32> = None;
    let mut reads = false;
    for p in programs {
        let (r, rd) = interpret(p, d)?;
        reads |= rd;
        best = match best {
            Some(b) if rank(b) < rank(r) => Some(b),
            _ => Some(r),
        };
    }
    best.map(|b| (b, reads))
}

/// Argument values probed one argument at a time.
fn probes() -> Vec<u64> {
    let mut v = vec![
        0,
        1,
        2,
        3,
        6,
        10,
        0xf,
        0xffff_ffff,
        u64::MAX,
        1 << 32,
        TIOCSTI,
        TIOCLINUX,
        TIOCSTI | (1 << 32),
        0x5413,
        libc::AF_NETLINK as u64,
        (libc::SOCK_STREAM | libc::SOCK_CLOEXEC) as u64,
        libc::SOCK_RAW as u64,
        libc::SOCK_DGRAM as u64,
        (libc::SOCK_DGRAM | libc::SOCK_NONBLOCK) as u64,
        libc::SOCK_SEQPACKET as u64,
        libc::IPPROTO_UDP as u64,
        libc::IPPROTO_ICMP as u64,
        libc::IPPROTO_ICMPV6 as u64,
        libc::IPPROTO_UDPLITE as u64,
        libc::IPPROTO_SCTP as u64,
        libc::IPPROTO_MPTCP as u64,
        libc::AF_PACKET as u64,
        libc::AF_UNIX as u64,
        CLONE_NEWTIME,
        libc::SIGCHLD as u64,
        libc::SIGCONT as u64,
        libc::SIGCONT as u64 | (1 << 32),
        libc::SIGSTOP as u64,
        (libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD) as u64,
        // Modes and open flags.
        0o755,
        0o4755,
        0o2755,
        0o2000,
        0o1777,
        0o6000 | (1 << 32),
        libc::S_IFREG as u64 | 0o4755,
        libc::O_CREAT as u64,
        (libc::O_CREAT | libc::O_WRONLY | libc::O_EXCL) as u64,
        (libc::O_TMPFILE | libc::O_RDWR) as u64,
        libc::O_DIRECTORY as u64,
        // Send flags, address lengths, fallocate modes.
        MSG_FASTOPEN,
        MSG_FASTOPEN | libc::MSG_NOSIGNAL as u64,
        libc::MSG_NOSIGNAL as u64,
        16,
        28,
        110,
        8,
        0x10,
        0x40,
        libc::SOCK_SEQPACKET as u64 | libc::SOCK_CLOEXEC as u64,
    ];
    for bit in 0..32 {
        let f = 1u64 << bit;
        if f & CLONE_NS_FLAGS != 0 {
            v.push(f);
            v.push(f | libc::SIGCHLD as u64);
        }
    }
    v
}

/// Values combined across the first three arguments (families, types, protocols, requests).
const COMBOS: [u64; 13] = [
    0,
    1,
    2,
    3,
    6,
    10,
    16,
    17,
    262,
    0x80001,
    TIOCSTI,
    0xffff_ffff,
    (1 << 32) | 1,
];

/// Values combined in the argument pairs of [`PAIRS`] (flags and modes, send flags and
/// address lengths).
const PAIR_VALUES: [u64; 10] = [
    0,
    0o4755,
    0o2000,
    0o755,
    libc::O_CREAT as u64,
    (libc::O_TMPFILE | libc::O_RDWR) as u64,
    MSG_FASTOPEN,
    16,
    0xffff_ffff,
    (1 << 32) | 0o4000,
];

/// Argument pairs whose decisions depend on each other: `open` (flags, mode), `openat`
/// (flags, mode), `sendto` (flags, address length).
const PAIRS: [(usize, usize); 3] = [(1, 2), (2, 3), (3, 5)];

/// Whether `fast` decides exactly like the reference `programs` for every syscall number
/// below [`MAX_NR`], x32 and out-of-range numbers and a foreign architecture (arguments
/// zero); and, for every number whose decision reads an argument in either program, for each
/// probe value in each argument, every combination of [`COMBOS`] in the first three and of
/// [`PAIR_VALUES`] in each of [`PAIRS`].
pub(crate) fn equivalent(fast: &[sock_filter], programs: &[Vec<sock_filter>]) -> bool {
    let fast = [fast.to_vec()];
    // Some(reads_args) when both agree.
    let same = |d: &[u8; 64]| match (combined(&fast, d), combined(programs, d)) {
        (Some((a, ra)), Some((b, rb))) if a == b => Some(ra || rb),
        _ => None,
    };
    let mut nrs: Vec<u32> = (0..MAX_NR).collect();
    nrs.extend([MAX_NR, 0x4000_0000, 0x4000_0001, 0x4000_0000 | 59, u32::MAX]);
    let mut filtered = Vec::new();
    for arch in [AUDIT_ARCH_X86_64, 0x4000_0003] {
        for nr in &nrs {
            match same(&data(arch, *nr, [0; 6])) {
                None => return false,
                Some(true) => filtered.push(*nr),
                Some(false) => {}
            }
        }
    }
    let probes = probes();
    for nr in filtered {
        for argi in 0..6 {
            for x in &probes {
                let mut args = [0u64; 6];
                args[argi] = *x;
                if same(&data(AUDIT_ARCH_X86_64, nr, args)).is_none() {
                    return false;
                }
            }
        }
        for x in COMBOS {
            for y in COMBOS {
                for z in COMBOS {
                    if same(&data(AUDIT_ARCH_X86_64, nr, [x, y, z, 0, 0, 0])).is_none() {
                        return false;
                    }
                }
            }
        }
        for (a, b) in PAIRS {
            for x in PAIR_VALUES {
                for y in PAIR_VALUES {
                    let mut args = [0u64; 6];
                    args[a] = x;
                    args[b] = y;
                    if same(&data(AUDIT_ARCH_X86_64, nr, args)).is_none() {
                        return false;
                    }
                }
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(network: &Network) -> Vec<Vec<sock_filter>> {
        seccomp::filters(network, &BTreeSet::new())
            .unwrap()
            .programs
            .iter()
            .map(|p| {
                p.iter()
                    .map(|i| sock_filter {
                        code: i.code,
                        jt: i.jt,
                        jf: i.jf,
                        k: i.k,
                    })
                    .collect()
            })
            .collect()
    }

    /// Every network shape, with no denied calls (the shipped profiles).
    fn shapes() -> [Network; 5] {
        [
            Network::Off,
            Network::Tcp {
                connect: [80].into(),
                bind: Default::default(),
            },
            Network::Tcp {
                connect: [80].into(),
                bind: [8080].into(),
            },
            Network::All,
            Network::Proxy(ollie_policy::ProxyNetwork::closed()),
        ]
    }

    #[test]
    fn proven_pairs_are_equivalent_and_listed() {
        let mut digests = Vec::new();
        // Each shape as shipped, then without `memfd_create` (the filter of a run without a
        // memory cgroup).
        let memfd: BTreeSet<String> = ["memfd_create".to_owned()].into();
        let pairs = shapes()
            .into_iter()
            .map(|n| (n, BTreeSet::new()))
            .chain(shapes().into_iter().map(|n| (n, memfd.clone())));
        for (network, deny) in pairs {
            let nrs = seccomp::denied_numbers(&deny).unwrap();
            let fast = compile(&network, &nrs).unwrap();
            let reference: Vec<Vec<sock_filter>> = seccomp::filters(&network, &deny)
                .unwrap()
                .programs
                .iter()
                .map(seccomp::to_sock_filters)
                .collect();
            let ref_len: usize = reference.iter().map(Vec::len).sum();
            assert!(
                fast.len() * 3 < ref_len,
                "{} vs {ref_len} instructions",
                fast.len()
            );
            assert!(equivalent(&fast, &reference), "{network:?}");
            digests.push(pair_digest(&fast, &reference));
        }
        // Exactly the proven pairs, in order: a compiler change makes this fail until the
        // list holds the new digests (printed here), which the check above has just proven.
        assert_eq!(
            digests, PROVEN,
            "update bpf::PROVEN to the digests on the left"
        );
    }

    #[test]
    fn a_one_shot_run_installs_the_tree_only_when_proven() {
        // Every shipped profile: the range tree, described by the record.
        for network in shapes() {
            let (p, record, layout) =
                programs(&network, &BTreeSet::new(), Unproven::Reference).unwrap();
            assert_eq!((layout, p.len(), record.filters), ("range-tree", 1, 1));
            assert_eq!(record.instructions, p[0].len());
            assert_eq!(record.hash, seccomp::program_hash(&p));
        }
        // A deny list no test checks: the reference programs, unchecked.
        let deny: BTreeSet<String> = ["mincore".to_owned(), "madvise".to_owned()].into();
        let (p, record, layout) = programs(&Network::Off, &deny, Unproven::Reference).unwrap();
        assert_eq!(layout, "reference");
        let reference = seccomp::filters(&Network::Off, &deny).unwrap();
        assert_eq!(p.len(), reference.programs.len());
        assert_eq!(record.denied, ["madvise", "mincore"]);
        // Checked once (as a prepared sandbox does), it is the tree from then on.
        let (_, _, layout) = programs(&Network::Off, &deny, Unproven::Check).unwrap();
        assert_eq!(layout, "range-tree");
        let (_, _, layout) = programs(&Network::Off, &deny, Unproven::Reference).unwrap();
        assert_eq!(layout, "range-tree");
    }

    #[test]
    fn equivalence_check_catches_a_difference() {
        let fast = compile(&Network::Off, &BTreeSet::new()).unwrap();
        let reference = reference(&Network::Off);
        // Allowing TIOCSTI must be noticed.
        let mut weak = fast.clone();
        for i in &mut weak {
            if i.code == JEQ_K && i.k == TIOCSTI as u32 {
                i.k = 0x1234_5678;
            }
        }
        assert!(!equivalent(&weak, &reference));
        // Compiling the TCP profile against the no-network reference must be noticed too.
        let tcp = compile(
            &Network::Tcp {
                connect: [80].into(),
                bind: Default::default(),
            },
            &BTreeSet::new(),
        )
        .unwrap();
        assert!(!equivalent(&tcp, &reference));
        // And the whole-network profile against the TCP reference, both ways (UDP differs).
        let tcp_ref = super::tests::reference(&Network::Tcp {
            connect: [80].into(),
            bind: Default::default(),
        });
        let all = compile(&Network::All, &BTreeSet::new()).unwrap();
        assert!(!equivalent(&all, &tcp_ref));
        assert!(!equivalent(&tcp, &super::tests::reference(&Network::All)));
        // A UDP leaf that lets ICMP datagrams through must be noticed.
        let mut icmp = all.clone();
        for i in &mut icmp {
            if i.code == JEQ_K && i.k == libc::IPPROTO_UDP as u32 {
                i.k = libc::IPPROTO_ICMP as u32;
            }
        }
        assert!(!equivalent(&icmp, &super::tests::reference(&Network::All)));
    }

    #[test]
    fn socket_leaf_decides_like_the_policy_says() {
        let prog = compile(&Network::All, &BTreeSet::new()).unwrap();
        let verdict = |family: i32, ty: i32, proto: i32| {
            let d = data(
                AUDIT_ARCH_X86_64,
                libc::SYS_socket as u32,
                [family as u64, ty as u64, proto as u64, 0, 0, 0],
            );
            interpret(&prog, &d).unwrap().0
        };
        for family in [libc::AF_INET, libc::AF_INET6] {
            for (ty, proto) in [
                (libc::SOCK_STREAM, 0),
                (libc::SOCK_STREAM, libc::IPPROTO_TCP),
                (libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0),
                (libc::SOCK_DGRAM, 0),
                (libc::SOCK_DGRAM, libc::IPPROTO_UDP),
                (
                    libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                    0,
                ),
            ] {
                assert_eq!(
                    verdict(family, ty, proto),
                    RET_ALLOW,
                    "{family} {ty} {proto}"
                );
            }
            for (ty, proto) in [
                (libc::SOCK_RAW, 0),
                (libc::SOCK_RAW, libc::IPPROTO_ICMP),
                (libc::SOCK_DGRAM, libc::IPPROTO_ICMP),
                (libc::SOCK_DGRAM, libc::IPPROTO_TCP),
                (libc::SOCK_STREAM, libc::IPPROTO_UDP),
                (libc::SOCK_STREAM, libc::IPPROTO_MPTCP),
                (libc::SOCK_SEQPACKET, 0),
                (libc::SOCK_STREAM, libc::IPPROTO_SCTP),
            ] {
                assert_eq!(verdict(family, ty, proto), EPERM, "{family} {ty} {proto}");
            }
        }
        for family in [libc::AF_UNIX, libc::AF_NETLINK, libc::AF_PACKET, 0] {
            for ty in [libc::SOCK_STREAM, libc::SOCK_DGRAM, libc::SOCK_RAW] {
                assert_eq!(verdict(family, ty, 0), EPERM, "{family} {ty}");
            }
        }
    }

    fn verdict(prog: &[sock_filter], nr: i64, args: [u64; 6]) -> u32 {
        interpret(prog, &data(AUDIT_ARCH_X86_64, nr as u32, args))
            .unwrap()
            .0
    }

    #[test]
    fn no_setid_modes_no_fast_open_no_datagram_pairs_no_allocation() {
        let tcp = Network::Tcp {
            connect: [80].into(),
            bind: Default::default(),
        };
        let proxy = Network::Proxy(ollie_policy::ProxyNetwork::closed());
        for network in [Network::Off, tcp.clone(), Network::All, proxy.clone()] {
            let p = compile(&network, &BTreeSet::new()).unwrap();
            for (nr, arg) in seccomp::MODE_ARGS {
                for (mode, want) in [
                    (0o755, RET_ALLOW),
                    (0o1777, RET_ALLOW),
                    (0o4755, EPERM),
                    (0o2755, EPERM),
                    (0o2777, EPERM),
                    (libc::S_IFREG as u64 | 0o6755, EPERM),
                ] {
                    let mut a = [0; 6];
                    a[usize::from(*arg)] = mode;
                    assert_eq!(verdict(&p, *nr, a), want, "{nr} {mode:o}");
                }
            }
            let creat = libc::O_CREAT as u64 | libc::O_WRONLY as u64;
            let tmp = (libc::O_TMPFILE | libc::O_RDWR) as u64;
            for (flags, mode, want) in [
                (creat, 0o644, RET_ALLOW),
                (creat, 0o4755, EPERM),
                (tmp, 0o2755, EPERM),
                (tmp, 0o600, RET_ALLOW),
                // Without O_CREAT the mode is ignored by the kernel.
                (libc::O_RDONLY as u64, 0o4755, RET_ALLOW),
            ] {
                assert_eq!(
                    verdict(&p, libc::SYS_openat, [0, 0, flags, mode, 0, 0]),
                    want
                );
                assert_eq!(verdict(&p, libc::SYS_open, [0, flags, mode, 0, 0, 0]), want);
            }
            assert_eq!(verdict(&p, libc::SYS_openat2, [0; 6]), ENOSYS);
            assert_eq!(verdict(&p, libc::SYS_clone3, [0; 6]), ENOSYS);
            let fo = MSG_FASTOPEN;
            assert_eq!(verdict(&p, libc::SYS_sendmsg, [3, 0, fo, 0, 0, 0]), EPERM);
            assert_eq!(verdict(&p, libc::SYS_sendmmsg, [3, 0, 1, fo, 0, 0]), EPERM);
            assert_eq!(verdict(&p, libc::SYS_sendto, [3, 0, 1, fo, 0, 0]), EPERM);
            assert_eq!(verdict(&p, libc::SYS_sendto, [3, 0, 1, 0, 0, 0]), RET_ALLOW);
            let to_addr = verdict(&p, libc::SYS_sendto, [3, 0, 1, 0, 1, 110]);
            if network == Network::All {
                assert_eq!(to_addr, RET_ALLOW);
            } else {
                assert_eq!(to_addr, EPERM, "{network:?}");
            }
            let unix = libc::AF_UNIX as u64;
            for (ty, want) in [
                (libc::SOCK_STREAM, RET_ALLOW),
                (libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, RET_ALLOW),
                (libc::SOCK_DGRAM, EPERM),
                (libc::SOCK_DGRAM | libc::SOCK_NONBLOCK, EPERM),
            ] {
                assert_eq!(
                    verdict(&p, libc::SYS_socketpair, [unix, ty as u64, 0, 0, 0, 0]),
                    want
                );
            }
            for (mode, want) in [
                (0, EOPNOTSUPP),
                (1, EOPNOTSUPP),
                (0x10, EOPNOTSUPP),
                (3, RET_ALLOW),
                (8, RET_ALLOW),
            ] {
                assert_eq!(
                    verdict(&p, libc::SYS_fallocate, [3, mode, 0, 1 << 30, 0, 0]),
                    want
                );
            }
        }
        // Binding: nothing under tcp without bind ports or under the proxy; inet address
        // sizes otherwise.
        for network in [&tcp, &proxy] {
            let p = compile(network, &BTreeSet::new()).unwrap();
            for nr in [
                libc::SYS_bind,
                libc::SYS_listen,
                libc::SYS_accept,
                libc::SYS_accept4,
            ] {
                assert_eq!(verdict(&p, nr, [3, 0, 16, 0, 0, 0]), EPERM);
            }
            assert_eq!(
                verdict(&p, libc::SYS_connect, [3, 0, 16, 0, 0, 0]),
                RET_ALLOW
            );
            // TCP sockets only: no UDP, raw or AF_UNIX socket.
            let stream = libc::SOCK_STREAM as u64;
            let inet = libc::AF_INET as u64;
            assert_eq!(
                verdict(&p, libc::SYS_socket, [inet, stream, 0, 0, 0, 0]),
                RET_ALLOW
            );
            for (family, ty) in [
                (inet, libc::SOCK_DGRAM as u64),
                (inet, libc::SOCK_RAW as u64),
                (libc::AF_UNIX as u64, stream),
                (libc::AF_NETLINK as u64, libc::SOCK_RAW as u64),
            ] {
                assert_eq!(
                    verdict(&p, libc::SYS_socket, [family, ty, 0, 0, 0, 0]),
                    EPERM
                );
            }
        }
        let bind = Network::Tcp {
            connect: Default::default(),
            bind: [8080].into(),
        };
        for network in [bind, Network::All] {
            let p = compile(&network, &BTreeSet::new()).unwrap();
            for (len, want) in [
                (16, RET_ALLOW),
                (28, RET_ALLOW),
                (20, EPERM),
                (110, EPERM),
                (2, EPERM),
            ] {
                assert_eq!(verdict(&p, libc::SYS_bind, [3, 0, len, 0, 0, 0]), want);
            }
            assert_eq!(verdict(&p, libc::SYS_listen, [3, 5, 0, 0, 0, 0]), RET_ALLOW);
        }
    }

    #[test]
    fn a_policy_deny_list_matches_the_reference_and_is_noticed() {
        let names: BTreeSet<String> =
            ["memfd_create", "ioctl", "socketpair", "fallocate", "clone3"]
                .into_iter()
                .map(String::from)
                .collect();
        let nrs = seccomp::denied_numbers(&names).unwrap();
        let reference: Vec<Vec<sock_filter>> = seccomp::filters(&Network::Off, &names)
            .unwrap()
            .programs
            .iter()
            .map(crate::seccomp::to_sock_filters)
            .collect();
        let fast = compile(&Network::Off, &nrs).unwrap();
        assert!(equivalent(&fast, &reference));
        assert_eq!(verdict(&fast, libc::SYS_memfd_create, [0; 6]), EPERM);
        assert_eq!(
            verdict(&fast, libc::SYS_ioctl, [0, 0x5413, 0, 0, 0, 0]),
            EPERM
        );
        // The profile without the deny list is not the same filter.
        let plain = compile(&Network::Off, &BTreeSet::new()).unwrap();
        assert!(!equivalent(&plain, &reference));
    }
}
