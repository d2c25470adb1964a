//! glibc's malloc gives threads up to eight arenas per CPU, and each arena keeps the
//! high-water mark of what its threads once allocated. A long-lived server whose thread pool
//! moves work between threads (tokio's blocking pool grows one for every fsync) ends up with
//! its live heap spread thinly over many arenas, each resident. [`limit_arenas`] caps them.
#![deny(clippy::undocumented_unsafe_blocks)]

use std::io;

/// Caps malloc at `max` arenas (`mallopt(M_ARENA_MAX)`) for the whole process. Call it before
/// the first thread starts. `max` 0 is refused; C libraries without the knob get
/// `Unsupported`.
pub fn limit_arenas(max: u16) -> io::Result<()> {
    if max == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "at least one malloc arena is needed",
        ));
    }
    set_arena_max(libc::c_int::from(max))
}

#[cfg(target_env = "gnu")]
#[allow(unsafe_code)]
fn set_arena_max(max: libc::c_int) -> io::Result<()> {
    // SAFETY: mallopt only sets an allocator tunable from two integers; M_ARENA_MAX bounds the
    // arenas created from now on and never touches memory already handed out.
    let r = unsafe { libc::mallopt(libc::M_ARENA_MAX, max) };
    if r == 1 {
        Ok(())
    } else {
        Err(io::Error::other("mallopt(M_ARENA_MAX) refused the value"))
    }
}

#[cfg(not(target_env = "gnu"))]
fn set_arena_max(_max: libc::c_int) -> io::Result<()> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "the C library has no M_ARENA_MAX",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_arena_limit_takes_a_positive_count() {
        assert_eq!(
            limit_arenas(0).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        limit_arenas(4).unwrap();
        // Threads started after the cap still allocate and free as before.
        let sums: Vec<usize> = (0..8)
            .map(|i| std::thread::spawn(move || vec![i; 1 << 16].iter().sum::<usize>()))
            .map(|t| t.join().unwrap())
            .collect();
        assert_eq!(sums[3], 3 << 16);
    }
}
