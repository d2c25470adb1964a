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
