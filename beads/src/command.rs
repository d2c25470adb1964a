//! The five namespace commands, parsed from a `ctl` line.

use std::fmt;

/// Where `mount` puts the new member.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Order {
    /// `-b` (Plan 9 `MBEFORE`): searched first.
    Before,
    /// `-a` (Plan 9 `MAFTER`): searched after the existing members.
    After,
    /// Neither flag: replaces everything at the point.
    #[default]
    Replace,
}

impl Order {
    /// The word used in the namespace file.
    pub fn as_str(self) -> &'static str {
        match self {
            Order::Before => "before",
            Order::After => "after",
            Order::Replace => "replace",
        }
    }
}

/// The flags of one `mount`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MountFlags {
    /// `-b`, `-a` or neither.
    pub order: Order,
    /// `-c`: the member is the point's create target.
    pub create: bool,
}

/// One namespace command, in the seed's Plan 9 argument order (`verb new old`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `start [slug]`
    Start {
        /// The optional human name.
        slug: Option<String>,
    },
    /// `mount [-b|-a] [-c] BEAD POINT`
    Mount {
        /// The flags.
        flags: MountFlags,
        /// The bead: URI, absolute path, uuid or short name.
        bead: String,
        /// The mount point (`/ctx`).
        point: String,
    },
    /// `unmount [BEAD] POINT`
    Unmount {
        /// One member (by name, URI, path, uuid or short name), or `None` for the whole point.
        bead: Option<String>,
        /// The mount point.
        point: String,
    },
    /// `ns`: print the mount table.
    Ns,
    /// `rfork`: make this namespace private.
    Rfork,
    /// `list`: the registry's beads (slug, uuid, creation time, URI).
    List,
}

const VERBS: &str = "start, mount, unmount, ns, rfork, list";
const USAGE_START: &str = "usage: start [slug]";
const USAGE_MOUNT: &str = "usage: mount [-b|-a] [-c] BEAD POINT";
const USAGE_UNMOUNT: &str = "usage: unmount [BEAD] POINT";

impl Command {
    /// Parses one command line. The verb may carry the seed's `bead-` prefix (`bead-mount`);
    /// words are separated by blanks. `mount` flags come before the operands, may be combined
    /// (`-bc`, `-ac`) or separate (`-b -c`), and `--` ends them; `-a` with `-b` is an error.
    /// Errors are one line, with the usage of the command.
    pub fn parse(line: &str) -> Result<Command, String> {
        let mut words = line.split_whitespace();
        let Some(verb) = words.next() else {
            return Err(format!("empty command (valid: {VERBS})"));
        };
        let args: Vec<&str> = words.collect();
        let bare = verb.strip_prefix("bead-").unwrap_or(verb);
        match bare {
            "start" => match args.as_slice() {
                [] => Ok(Command::Start { slug: None }),
                [slug] if !slug.starts_with('-') => Ok(Command::Start {
                    slug: Some((*slug).to_string()),
                }),
                _ => Err(format!("start: bad arguments ({USAGE_START})")),
            },
            "mount" => parse_mount(&args),
            "unmount" => match args.as_slice() {
                [point] => Ok(Command::Unmount {
                    bead: None,
                    point: (*point).to_string(),
                }),
                [bead, point] if !bead.starts_with('-') => Ok(Command::Unmount {
                    bead: Some((*bead).to_string()),
                    point: (*point).to_string(),
                }),
                _ => Err(format!("unmount: bad arguments ({USAGE_UNMOUNT})")),
            },
            "ns" | "rfork" | "list" if !args.is_empty() => {
                Err(format!("{bare}: takes no arguments"))
            }
            "ns" => Ok(Command::Ns),
            "rfork" => Ok(Command::Rfork),
            "list" => Ok(Command::List),
            _ => Err(format!("unknown command {verb:?} (valid: {VERBS})")),
        }
    }
}

fn parse_mount(args: &[&str]) -> Result<Command, String> {
    let mut flags = MountFlags::default();
    let (mut before, mut after) = (false, false);
    let mut rest = args;
    while let Some((first, tail)) = rest.split_first() {
        if *first == "--" {
            rest = tail;
            break;
        }
        let Some(letters) = first.strip_prefix('-') else {
            break;
        };
        if letters.is_empty() {
            return Err(format!("mount: bad flag \"-\" ({USAGE_MOUNT})"));
        }
        for c in letters.chars() {
            match c {
                'b' => before = true,
                'a' => after = true,
                'c' => flags.create = true,
                _ => return Err(format!("mount: unknown flag -{c} ({USAGE_MOUNT})")),
            }
        }
        rest = tail;
    }
    flags.order = match (before, after) {
        (true, true) => {
            return Err(format!(
                "mount: -a and -b exclude each other ({USAGE_MOUNT})"
            ));
        }
        (true, false) => Order::Before,
        (false, true) => Order::After,
        (false, false) => Order::Replace,
    };
    match rest {
        [bead, point] => Ok(Command::Mount {
            flags,
            bead: (*bead).to_string(),
            point: (*point).to_string(),
        }),
        _ => Err(format!(
            "mount: need a bead and a mount point ({USAGE_MOUNT})"
        )),
    }
}

impl fmt::Display for Command {
    /// The canonical spelling (without the `bead-` prefix); it parses back to the same command.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Command::Start { slug: None } => f.write_str("start"),
            Command::Start { slug: Some(s) } => write!(f, "start {s}"),
            Command::Mount { flags, bead, point } => {
                let order = match flags.order {
                    Order::Before => "b",
                    Order::After => "a",
                    Order::Replace => "",
                };
                let c = if flags.create { "c" } else { "" };
                // A bead that looks like a flag was given after `--`, and needs it again.
                let end = if bead.starts_with('-') { "-- " } else { "" };
                if order.is_empty() && c.is_empty() {
                    write!(f, "mount {end}{bead} {point}")
                } else {
                    write!(f, "mount -{order}{c} {end}{bead} {point}")
                }
            }
            Command::Unmount { bead: None, point } => write!(f, "unmount {point}"),
            Command::Unmount {
                bead: Some(b),
                point,
            } => write!(f, "unmount {b} {point}"),
            Command::Ns => f.write_str("ns"),
            Command::Rfork => f.write_str("rfork"),
            Command::List => f.write_str("list"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bead_that_looks_like_a_flag_prints_back_after_double_dash() {
        // Found by the fuzz target: `mount -- -ac[ 8` printed as `mount -ac[ 8`.
        for line in [
            "mount --  -ac[\r\r8",
            "mount -b -- -x /ctx",
            "mount -- - /ctx",
        ] {
            let c = Command::parse(line).unwrap();
            assert_eq!(
                Command::parse(&c.to_string()).unwrap(),
                c,
                "{line:?} -> {c}"
            );
        }
        assert_eq!(
            Command::parse("mount -- -ac[ 8").unwrap().to_string(),
            "mount -- -ac[ 8"
        );
    }

    fn mount(order: Order, create: bool, bead: &str) -> Command {
        Command::Mount {
            flags: MountFlags { order, create },
            bead: bead.into(),
            point: "/ctx".into(),
        }
    }

    #[test]
    fn parses_every_command_and_flag_combination() {
        let cases = [
            ("start", Command::Start { slug: None }),
            (
                "bead-start plan9-beads",
                Command::Start {
                    slug: Some("plan9-beads".into()),
                },
            ),
            ("mount A /ctx", mount(Order::Replace, false, "A")),
            ("mount -b A /ctx", mount(Order::Before, false, "A")),
            ("bead-mount -a B /ctx", mount(Order::After, false, "B")),
            ("mount -c C /ctx", mount(Order::Replace, true, "C")),
            ("mount -ac C /ctx", mount(Order::After, true, "C")),
            ("mount -bc C /ctx", mount(Order::Before, true, "C")),
            ("mount -ca C /ctx", mount(Order::After, true, "C")),
            ("mount -b -c C /ctx", mount(Order::Before, true, "C")),
            ("  mount\t-a  B   /ctx  ", mount(Order::After, false, "B")),
            ("mount -a -- -odd /ctx", mount(Order::After, false, "-odd")),
            (
                "unmount /ctx",
                Command::Unmount {
                    bead: None,
                    point: "/ctx".into(),
                },
            ),
            (
                "bead-unmount B /ctx",
                Command::Unmount {
                    bead: Some("B".into()),
                    point: "/ctx".into(),
                },
            ),
            ("ns", Command::Ns),
            ("bead-ns", Command::Ns),
            ("rfork", Command::Rfork),
            ("bead-rfork", Command::Rfork),
        ];
        for (line, want) in cases {
            let got = Command::parse(line).unwrap_or_else(|e| panic!("{line}: {e}"));
            assert_eq!(got, want, "{line}");
            if !line.contains("--") {
                assert_eq!(Command::parse(&got.to_string()).unwrap(), got, "{line}");
            }
        }
    }

    #[test]
    fn usage_errors() {
        let cases = [
            (
                "",
                "empty command (valid: start, mount, unmount, ns, rfork, list)",
            ),
            (
                "frob",
                "unknown command \"frob\" (valid: start, mount, unmount, ns, rfork, list)",
            ),
            (
                "mount",
                "mount: need a bead and a mount point (usage: mount [-b|-a] [-c] BEAD POINT)",
            ),
            (
                "mount A",
                "mount: need a bead and a mount point (usage: mount [-b|-a] [-c] BEAD POINT)",
            ),
            (
                "mount A /ctx extra",
                "mount: need a bead and a mount point (usage: mount [-b|-a] [-c] BEAD POINT)",
            ),
            (
                "mount -ab A /ctx",
                "mount: -a and -b exclude each other (usage: mount [-b|-a] [-c] BEAD POINT)",
            ),
            (
                "mount -x A /ctx",
                "mount: unknown flag -x (usage: mount [-b|-a] [-c] BEAD POINT)",
            ),
            (
                "unmount",
                "unmount: bad arguments (usage: unmount [BEAD] POINT)",
            ),
            (
                "unmount a b c",
                "unmount: bad arguments (usage: unmount [BEAD] POINT)",
            ),
            ("start a b", "start: bad arguments (usage: start [slug])"),
            ("ns x", "ns: takes no arguments"),
            ("rfork x", "rfork: takes no arguments"),
        ];
        for (line, want) in cases {
            assert_eq!(Command::parse(line).unwrap_err(), want, "{line:?}");
        }
    }
}
