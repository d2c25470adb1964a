//! The tools toolsrv offers, by name: shared by toolsrv (which runs them) and olliesrv
//! (which lists them and loads them per agent). What each one runs, and its JSON schema, is
//! toolsrv's business (`ollie_toolsrv::tools`).

/// A registered tool.
#[derive(Debug)]
pub struct ToolDef {
    pub name: &'static str,
    pub description: &'static str,
    /// Whether it never changes anything (the agent loop may run such calls in parallel).
    pub read_only: bool,
}

/// Every tool, in listing order.
pub const TOOLS: &[ToolDef] = &[
    ToolDef {
        name: "execute_code",
        description: "run code in an interpreter (bash, sh, python3, …) in the sandbox",
        read_only: false,
    },
    ToolDef {
        name: "execute_tool",
        description: "run a named script from the tools directory with arguments",
        read_only: false,
    },
    ToolDef {
        name: "execute_pipe",
        description: "run code steps as a pipeline, each step's stdout feeding the next's stdin",
        read_only: false,
    },
    ToolDef {
        name: "file_read",
        description: "read a text file with line numbers (offset/limit in lines)",
        read_only: true,
    },
    ToolDef {
        name: "file_write",
        description: "write a file, or replace a range of its lines",
        read_only: false,
    },
];

/// The names of every tool.
pub fn names() -> Vec<&'static str> {
    TOOLS.iter().map(|t| t.name).collect()
}
/// `file_read`'s result text for `text`, the file's lines from line `first` on (the caller
/// read up to `want + 1` of them; one past `want` only tells that more follow): each line
/// numbered (`{:>6}\t`), then a note when more follow, when `first` is past the end, or when
/// the file is empty. A file containing NUL is not shown.
pub fn number_lines(text: &[u8], first: u64, want: u64) -> String {
    if text.contains(&0) {
        return format!("binary file ({}+ bytes); not shown\n", text.len());
    }
    let text = String::from_utf8_lossy(text);
    let mut out = String::new();
    let mut n = 0u64;
    for (i, line) in text.split_inclusive('\n').enumerate() {
        let i = i as u64;
        if i >= want {
            out.push_str(&format!(
                "[more lines follow; continue with offset={}]\n",
                first + want
            ));
            break;
        }
        out.push_str(&format!("{:>6}\t{}", first + i, line));
        if !line.ends_with('\n') {
            out.push('\n');
        }
        n += 1;
    }
    if n == 0 && first > 1 {
        out.push_str(&format!(
            "[no lines at offset {first}; the file is shorter]\n"
        ));
    } else if n == 0 {
        out.push_str("[empty file]\n");
    }
    out
}
