//! Files on the host as tests compare them, and shell scripts that make two sandboxed runs
//! meet.

use std::path::Path;

/// Every entry under `dir` with its contents (directories end in `/`; anything neither a file
/// nor a directory, such as an overlay whiteout, is `NAME (special)`), sorted.
pub fn tree(dir: &Path) -> Vec<(String, String)> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, String)>) {
        for e in std::fs::read_dir(dir)
            .expect("list a directory of the tree")
            .flatten()
        {
            let p = e.path();
            let name = p
                .strip_prefix(root)
                .expect("an entry under the root")
                .display()
                .to_string();
            let ft = e.file_type().expect("an entry's type");
            if ft.is_dir() {
                out.push((format!("{name}/"), String::new()));
                walk(root, &p, out);
            } else if ft.is_file() {
                out.push((
                    name,
                    std::fs::read_to_string(&p).expect("read a file of the tree"),
                ));
            } else {
                out.push((format!("{name} (special)"), String::new()));
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// Two shell scripts that are running at the same moment before either does its part: the
/// first creates `dir/ready` and waits for `dir/go`, then runs `first`; the second waits for
/// `dir/ready`, runs `second`, then creates `dir/go`. Each wait gives up after about 30 s
/// (exit 3: a failure, not a hang).
pub fn meeting_scripts(dir: &Path, first: &str, second: &str) -> (String, String) {
    let d = dir.display();
    let wait = |f: &str| {
        format!(
            "i=0; while [ ! -e {d}/{f} ] && [ $i -lt 3000 ]; do sleep 0.01; i=$((i+1)); done; \
             [ -e {d}/{f} ] || {{ echo 'no {f}' >&2; exit 3; }}"
        )
    };
    (
        format!("touch {d}/ready && {} && {first}", wait("go")),
        format!("{} && {second} && touch {d}/go", wait("ready")),
    )
}
