//! `o bead`: the seed's five bead commands (`bead-start`, `bead-mount`, `bead-unmount`,
//! `bead-ns`, `bead-rfork`) as writes to a session's or agent's `ns/ctl`, printing the reply.

use clap::Subcommand;

/// One bead command, with the seed's Plan 9 argument order (`verb new old`).
#[derive(Debug, Clone, PartialEq, Eq, Subcommand)]
pub enum Verb {
    /// Create a bead for this chat if none is open (an open one is named SLUG if it has no
    /// name yet; another name than its own is refused); prints its URI.
    Start {
        /// A human name (1–64 of a-z 0-9 . _ -).
        slug: Option<String>,
    },
    /// Attach BEAD's tree at POINT as a union member.
    #[command(
        after_help = "Without -b or -a the bead replaces everything at POINT. Flags combine: \
        -ac = searched after the others and the create target.\n\n\
        EXAMPLES:\n  o bead mount -b 883c513f-… /ctx\n  o bead mount -a storm-event /ctx\n  \
        o bead mount -ac sensor-fusion-notes /ctx"
    )]
    Mount {
        /// Searched first on reads.
        #[arg(short = 'b', conflicts_with = "after")]
        before: bool,
        /// Searched after the existing members.
        #[arg(short = 'a')]
        after: bool,
        /// The create target: new notes, skills and artifacts land in it.
        #[arg(short = 'c')]
        create: bool,
        /// A file:// URI, an absolute path, a uuid or a short name.
        bead: String,
        /// The mount point, e.g. /ctx.
        point: String,
    },
    /// Remove BEAD from the union at POINT, or everything at POINT.
    Unmount {
        /// BEAD and POINT, or POINT alone.
        #[arg(required = true, num_args = 1..=2, value_names = ["BEAD", "POINT"])]
        args: Vec<String>,
    },
    /// Print the mount table: each point, its members in search order, the create target.
    Ns,
    /// Make this chat's namespace private (new agents already start with a private copy).
    Rfork,
    /// List the registry's beads: slug, uuid, creation time and URI, oldest first.
    Ls,
}

impl Verb {
    /// The `ns/ctl` line.
    pub fn line(&self) -> String {
        match self {
            Verb::Start { slug: None } => "start".to_owned(),
            Verb::Start { slug: Some(s) } => format!("start {s}"),
            Verb::Mount {
                before,
                after,
                create,
                bead,
                point,
            } => {
                let mut flags = String::new();
                if *before {
                    flags.push('b');
                }
                if *after {
                    flags.push('a');
                }
                if *create {
                    flags.push('c');
                }
                if flags.is_empty() {
                    format!("mount {bead} {point}")
                } else {
                    format!("mount -{flags} {bead} {point}")
                }
            }
            Verb::Unmount { args } => format!("unmount {}", args.join(" ")),
            Verb::Ns => "ns".to_owned(),
            Verb::Rfork => "rfork".to_owned(),
            Verb::Ls => "list".to_owned(),
        }
    }

    /// Words that would split or smuggle a second command into the line.
    pub fn check(&self) -> Result<(), String> {
        let words: Vec<&str> = match self {
            Verb::Start { slug } => slug.iter().map(String::as_str).collect(),
            Verb::Mount { bead, point, .. } => vec![bead, point],
            Verb::Unmount { args } => args.iter().map(String::as_str).collect(),
            Verb::Ns | Verb::Rfork | Verb::Ls => Vec::new(),
        };
        for w in words {
            if w.is_empty() || w.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(format!(
                    "{w:?}: bead names and points are single words without spaces or control characters"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct T {
        #[command(subcommand)]
        v: Verb,
    }

    fn line(args: &[&str]) -> Result<String, String> {
        let t = T::try_parse_from(std::iter::once("bead").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        t.v.check()?;
        Ok(t.v.line())
    }

    #[test]
    fn lines_keep_the_seeds_argument_order_and_flags() {
        assert_eq!(line(&["start"]).unwrap(), "start");
        assert_eq!(line(&["start", "notes"]).unwrap(), "start notes");
        assert_eq!(line(&["mount", "A", "/ctx"]).unwrap(), "mount A /ctx");
        assert_eq!(
            line(&["mount", "-b", "A", "/ctx"]).unwrap(),
            "mount -b A /ctx"
        );
        assert_eq!(
            line(&["mount", "-ac", "C", "/ctx"]).unwrap(),
            "mount -ac C /ctx"
        );
        assert_eq!(
            line(&["mount", "-c", "-b", "C", "/ctx"]).unwrap(),
            "mount -bc C /ctx"
        );
        assert_eq!(line(&["unmount", "/ctx"]).unwrap(), "unmount /ctx");
        assert_eq!(line(&["unmount", "B", "/ctx"]).unwrap(), "unmount B /ctx");
        assert_eq!(line(&["ns"]).unwrap(), "ns");
        assert_eq!(line(&["rfork"]).unwrap(), "rfork");
        assert_eq!(line(&["ls"]).unwrap(), "list");
    }

    #[test]
    fn bad_uses_are_refused_before_anything_is_sent() {
        assert!(line(&["mount", "-a", "-b", "A", "/ctx"]).is_err());
        assert!(line(&["mount", "A"]).is_err());
        assert!(line(&["unmount"]).is_err());
        assert!(line(&["unmount", "a", "b", "c"]).is_err());
        assert!(line(&["mount", "A B", "/ctx"]).is_err());
        assert!(line(&["start", "x\nmount y /z"]).is_err());
        assert!(line(&["frob"]).is_err());
    }
}
