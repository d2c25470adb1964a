//! Seeing that a frozen run has stopped ([`crate::Cancel::freeze`]).
//!
//! The runner asks pid 1 of the run to send SIGSTOP to every other process of its pid
//! namespace ([`crate::sys::FREEZE_SIGNAL`]). A process stops at its next return to user
//! space, so a process in the middle of a system call (a large `write`, a `rename`) finishes it
//! first; the freeze counts only once every thread of every process of the run is seen
//! stopped. The processes of a run are exactly the descendants of its pid 1 (orphans are
//! reparented to it), found through `/proc/PID/task/TID/children`, or where the kernel lacks
//! those files by the parent pids of every process in `/proc`.
//!
//! Why one look is not enough, and two are: a process seen stopped stays stopped, because
//! nothing in the run can send SIGCONT (the tool's syscall filter refuses it, and pid 1 drops
//! one that comes from inside while frozen), and a stopped process creates no process. A
//! process still running during a look may fork a child that the look's listing missed, so
//! the freeze is confirmed by two consecutive looks that find the same processes, all
//! stopped.

use std::collections::{BTreeSet, HashMap};
use std::io;
use std::os::fd::RawFd;

/// The pid (in this process's pid namespace) of the process `pidfd` refers to, from
/// `/proc/self/fdinfo` (`Pid:`; -1 once it has been reaped).
pub(crate) fn pid_of_pidfd(pidfd: RawFd) -> Option<i32> {
    let text = std::fs::read_to_string(format!("/proc/self/fdinfo/{pidfd}")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("Pid:"))
        .and_then(|v| v.trim().parse().ok())
        .filter(|p: &i32| *p > 0)
}

/// One `/proc/PID/stat` (or `task/TID/stat`): the state letter and the parent pid. The
/// command name is in parentheses and may hold anything, so the fields are read after the
/// last `)`.
fn stat_fields(text: &str) -> Option<(char, i32)> {
    let rest = &text[text.rfind(')')? + 1..];
    let mut f = rest.split_ascii_whitespace();
    let state = f.next()?.chars().next()?;
    let ppid = f.next()?.parse().ok()?;
    Some((state, ppid))
}

/// Stopped (by a signal or a tracer), or no longer running at all.
fn is_still(state: char) -> bool {
    matches!(state, 'T' | 't' | 'Z' | 'X' | 'x')
}

/// The descendants of `init` by `/proc/PID/task/TID/children` (`CONFIG_PROC_CHILDREN`), or
/// `None` where the kernel has no such file. Each list is exact for a stopped task; one that
/// still runs may miss a child it is forking, which the second look finds.
fn descendants_by_children(init: i32) -> Option<BTreeSet<i32>> {
    let first = format!("/proc/{init}/task/{init}/children");
    if std::fs::metadata(&first).is_err() {
        return None;
    }
    let mut found = BTreeSet::new();
    let mut todo = vec![init];
    while let Some(p) = todo.pop() {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else {
            continue;
        };
        for t in tasks.flatten() {
            let Ok(text) = std::fs::read_to_string(t.path().join("children")) else {
                continue;
            };
            for c in text.split_ascii_whitespace().filter_map(|c| c.parse().ok()) {
                if found.insert(c) {
                    todo.push(c);
                }
            }
        }
    }
    Some(found)
}

/// The descendants of `init` by the parent pid of every process in `/proc`.
fn descendants_by_scan(init: i32) -> io::Result<BTreeSet<i32>> {
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    for e in std::fs::read_dir("/proc")? {
        let Ok(e) = e else { continue };
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        if let Ok(t) = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            && let Some((_, ppid)) = stat_fields(&t)
        {
            children.entry(ppid).or_default().push(pid);
        }
    }
    let mut found = BTreeSet::new();
    let mut todo = children.get(&init).cloned().unwrap_or_default();
    while let Some(p) = todo.pop() {
        if found.insert(p)
            && let Some(c) = children.get(&p)
        {
            todo.extend(c);
        }
    }
    Ok(found)
}

/// The descendants of `init` now, and whether every thread of each is still (stopped or a
/// zombie). Processes that vanish during the look are skipped (they are gone).
pub(crate) fn look(init: i32) -> io::Result<(BTreeSet<i32>, bool)> {
    let found = match descendants_by_children(init) {
        Some(f) => f,
        None => descendants_by_scan(init)?,
    };
    let mut all_still = true;
    for &pid in &found {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for t in tasks.flatten() {
            if let Ok(text) = std::fs::read_to_string(t.path().join("stat"))
                && let Some((state, _)) = stat_fields(&text)
                && !is_still(state)
            {
                all_still = false;
            }
        }
    }
    Ok((found, all_still))
}

/// SIGKILL to every descendant of `init` now, each through its own pidfd (a pid that ended
/// meanwhile is skipped). The runner does this right after it kills pid 1 for a disk limit:
/// the kernel kills the rest of the pid namespace only once pid 1 has been scheduled to
/// exit, and writers on the other cores keep writing until then.
pub(crate) fn kill_descendants(init: i32) {
    let found = descendants_by_children(init)
        .or_else(|| descendants_by_scan(init).ok())
        .unwrap_or_default();
    for pid in found {
        if let Ok(fd) = crate::sys::pidfd_open(pid) {
            let _ = crate::sys::pidfd_send_signal(&fd, libc::SIGKILL);
        }
    }
}

/// A freeze being confirmed: looks until two in a row find the same processes, all still.
#[derive(Debug, Default)]
pub(crate) struct Confirm {
    last: Option<BTreeSet<i32>>,
}

impl Confirm {
    /// One more look at `init`'s descendants; true once the freeze is confirmed.
    pub(crate) fn step(&mut self, init: i32) -> bool {
        match look(init) {
            Ok((found, true)) => {
                if self.last.as_ref() == Some(&found) {
                    return true;
                }
                self.last = Some(found);
                false
            }
            _ => {
                self.last = None;
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_with_odd_command_names_are_read_after_the_last_parenthesis() {
        assert_eq!(stat_fields("12 (a b) T 7 12 12 0"), Some(('T', 7)));
        assert_eq!(stat_fields("12 (x) R) S 1 2"), Some(('S', 1)));
        assert_eq!(stat_fields("12 (x"), None);
        assert_eq!(stat_fields(""), None);
        assert!(is_still('T') && is_still('Z') && !is_still('R') && !is_still('D'));
    }

    #[test]
    fn a_stopped_process_tree_is_confirmed_and_a_running_one_is_not() {
        // sh (the stand-in for pid 1) and its child, a sleep.
        let mut sh = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & wait"])
            .spawn()
            .unwrap();
        let init = sh.id() as i32;
        let kids = loop {
            let (found, _) = look(init).unwrap();
            if !found.is_empty() {
                break found;
            }
            std::thread::yield_now();
        };
        assert_eq!(kids.len(), 1);
        let (_, still) = look(init).unwrap();
        assert!(!still, "a sleeping process is not stopped");
        let mut c = Confirm::default();
        assert!(!c.step(init) && !c.step(init));
        let pid = kids.iter().next().unwrap().to_string();
        let st = std::process::Command::new("kill")
            .args(["-STOP", &pid])
            .status()
            .unwrap();
        assert!(st.success());
        let mut c = Confirm::default();
        let mut confirmed = false;
        for _ in 0..1000 {
            if c.step(init) {
                confirmed = true;
                break;
            }
            std::thread::yield_now();
        }
        assert!(confirmed, "a stopped tree is confirmed");
        assert_eq!(
            descendants_by_scan(init).unwrap(),
            descendants_by_children(init).unwrap_or_else(|| descendants_by_scan(init).unwrap())
        );
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &pid])
            .status();
        sh.kill().unwrap();
        sh.wait().unwrap();
        assert_eq!(pid_of_pidfd(-1), None);
    }
}
