//! An agent's chat: the append-only transcript with its block markers, read by offset and
//! waited on by readers.
//!
//! Only the end of each stream is kept in memory: the last [`KEEP`] bytes or so, and whatever
//! is not yet durable in `chat.raw` (the block being streamed). Older bytes are read back from
//! `chat.raw` on disk, so a long-lived agent's chat costs a bounded amount of memory. `chat`
//! (the text without marker lines) is not stored: an old part of it is `chat.raw`'s matching
//! part with the markers stripped, found through the cut points memory was trimmed at.

use std::sync::Mutex;

use bytes::Bytes;
use tokio::sync::watch;

use crate::util::lock;

/// At least this much of the raw stream stays in memory (`log` serves the last 64 KiB).
const KEEP: usize = 64 * 1024;
/// Memory is trimmed back to about [`KEEP`] once the raw stream in memory passes this.
const HIGH: usize = KEEP + 16 * 1024;
/// What each stream's buffer grows to at most while appends are small: [`HIGH`] and the
/// append that passes it (a buffer that doubled past it would keep the extra for good).
const ROOM: usize = HIGH + 16 * 1024;

/// At most this many cut points are kept (16 bytes each). Past it every second one is
/// dropped, so the segments read back from `chat.raw` double in length instead of the list
/// growing with the chat: a 1 GiB chat costs 32 KiB of cuts and reads back 1 MiB at a time.
const MAX_CUTS: usize = 2048;

/// Reads up to `len` bytes of `chat.raw` at an offset (shorter only at the end of the file).
pub type Reader = Box<dyn Fn(u64, usize) -> Result<Vec<u8>, String> + Send + Sync>;

#[derive(Debug, Default)]
struct ChatInner {
    /// The raw stream from `raw_base` on; the bytes before it are in `chat.raw` only.
    raw: Vec<u8>,
    raw_base: u64,
    /// The text stream from `text_base` on (the text of `raw`).
    text: Vec<u8>,
    text_base: u64,
    /// How much of the raw stream, from its start, is in `chat.raw` at the same offsets.
    durable: u64,
    /// Set when memory and `chat.raw` disagree (an append to disk failed): nothing after
    /// `durable` can be read back from disk, so nothing more is dropped from memory.
    diverged: bool,
    /// `(raw offset, text offset)` of points memory was cut at, from `(0, 0)` to
    /// `(raw_base, text_base)`, at most [`MAX_CUTS`]; each lies at the start of a line.
    cuts: Vec<(u64, u64)>,
    /// The text of the last segment between two cuts that was read back: its index and bytes.
    decoded: Option<(usize, Bytes)>,
    closed: bool,
}

impl ChatInner {
    fn raw_len(&self) -> u64 {
        self.raw_base + self.raw.len() as u64
    }

    fn text_len(&self) -> u64 {
        self.text_base + self.text.len() as u64
    }

    fn push(&mut self, raw: &[u8], text: &[u8]) {
        append(&mut self.raw, raw);
        append(&mut self.text, text);
    }

    /// Drops the oldest bytes from memory once there are too many, keeping [`KEEP`] and
    /// everything not durable; cuts only at a line start, so the text of what is dropped is
    /// exactly the dropped raw bytes without their marker lines.
    fn trim(&mut self) {
        if self.raw.len() <= HIGH {
            return;
        }
        let limit = self.durable.min(self.raw_len() - KEEP as u64);
        let Some(limit) = limit.checked_sub(self.raw_base) else {
            return;
        };
        // `limit` is below `raw.len()`, so it fits.
        let limit = usize::try_from(limit).unwrap_or(0);
        let Some(nl) = self.raw[..limit].iter().rposition(|b| *b == b'\n') else {
            return;
        };
        let cut = nl + 1;
        let text_cut = stripped_len(&self.raw[..cut]).min(self.text.len());
        self.raw.drain(..cut);
        self.text.drain(..text_cut);
        // After a large append (or a restore) the buffers may have grown past what is kept.
        self.raw.shrink_to(ROOM);
        self.text.shrink_to(ROOM);
        self.raw_base += cut as u64;
        self.text_base += text_cut as u64;
        self.cuts.push((self.raw_base, self.text_base));
        if self.cuts.len() > MAX_CUTS {
            self.coarsen();
        }
    }

    /// Halves the cut points: keeps the first, every second one and the last (memory's
    /// start). Segment indexes change, so the decoded one is forgotten.
    fn coarsen(&mut self) {
        let last = self.cuts.last().copied();
        let mut kept: Vec<(u64, u64)> = self.cuts.iter().step_by(2).copied().collect();
        if kept.last().copied() != last {
            kept.extend(last);
        }
        self.cuts = kept;
        self.decoded = None;
    }
}

/// Appends `b` to `v`, growing it by doubling but not past [`ROOM`] (unless `b` needs more):
/// trimmed back below [`HIGH`], a chat never needs more.
fn append(v: &mut Vec<u8>, b: &[u8]) {
    let need = v.len() + b.len();
    if need > v.capacity() {
        let want = (v.capacity() * 2).clamp(need, ROOM.max(need));
        v.reserve_exact(want - v.len());
    }
    v.extend_from_slice(b);
}

/// An agent's conversation as two append-only streams: `chat.raw` (with block markers) and
/// `chat` (the same without marker lines). Reads at the end wait for more; EOF once closed.
pub struct Chat {
    inner: Mutex<ChatInner>,
    tick: watch::Sender<u64>,
    disk: Reader,
}

impl std::fmt::Debug for Chat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chat").field("inner", &self.inner).finish()
    }
}

/// Which chat stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChatKind {
    Raw,
    Text,
}

impl Chat {
    /// An empty chat whose older bytes `disk` reads back from `chat.raw`.
    pub(crate) fn new(disk: Reader) -> Chat {
        Chat {
            inner: Mutex::new(ChatInner {
                cuts: vec![(0, 0)],
                ..ChatInner::default()
            }),
            tick: watch::Sender::new(0),
            disk,
        }
    }

    /// Restores from the first `len` bytes of `chat.raw`, read through in pieces (only the
    /// end stays in memory).
    pub(crate) fn restore(&self, len: u64) -> Result<(), String> {
        let mut c = lock(&self.inner);
        let read = self.read_through(&mut c, len);
        if read.is_err() {
            // What is in memory is only a part of chat.raw: later appends land at other
            // offsets on disk than in memory.
            c.diverged = true;
        }
        read
    }

    fn read_through(&self, c: &mut ChatInner, len: u64) -> Result<(), String> {
        const PIECE: usize = 1 << 20;
        let mut at = 0u64;
        let mut partial = Vec::new();
        while at < len {
            let want = usize::try_from(len - at).map_or(PIECE, |n| n.min(PIECE));
            let piece = (self.disk)(at, want)?;
            if piece.is_empty() {
                break;
            }
            at += piece.len() as u64;
            partial.extend_from_slice(&piece);
            // Whole lines only, so that a marker line split between two pieces is seen whole.
            let whole = partial
                .iter()
                .rposition(|b| *b == b'\n')
                .map_or(0, |p| p + 1);
            let lines: Vec<u8> = partial.drain(..whole).collect();
            c.push(&lines, &strip_markers(&lines));
            c.durable = c.raw_len();
            c.trim();
        }
        c.push(&partial, &strip_markers(&partial));
        c.durable = c.raw_len();
        Ok(())
    }

    /// What closes the last block if `chat.raw` ends inside one (a torn append: a crash
    /// during the write): a line break if the last line has none, then `]]]`.
    pub(crate) fn unclosed(&self) -> Option<&'static [u8]> {
        let c = lock(&self.inner);
        if c.raw_len() == 0 || c.raw.ends_with(b"\n]]]\n") || c.raw == b"]]]\n" {
            None
        } else if c.raw.ends_with(b"\n") {
            Some(b"]]]\n")
        } else {
            Some(b"\n]]]\n")
        }
    }

    /// One whole block: `[[[kind attrs` / body / `]]]`. Returns the raw bytes and the text.
    /// A line break in `attrs` becomes a space: the head is always one line.
    pub fn block_bytes(kind: &str, attrs: &str, body: &str) -> (Vec<u8>, Vec<u8>) {
        let mut body = body.to_owned();
        if !body.ends_with('\n') {
            body.push('\n');
        }
        // A body line that looks like a marker would be misread: indent it by one space.
        let body: String = body
            .split_inclusive('\n')
            .map(|l| {
                if is_marker(l.trim_end_matches('\n').as_bytes()) {
                    format!(" {l}")
                } else {
                    l.to_owned()
                }
            })
            .collect();
        let attrs = attrs.replace(['\n', '\r'], " ");
        let head = if attrs.is_empty() {
            format!("[[[{kind}\n")
        } else {
            format!("[[[{kind} {attrs}\n")
        };
        let raw = format!("{head}{body}]]]\n").into_bytes();
        (raw, body.into_bytes())
    }

    /// Appends bytes that are not (yet) in `chat.raw`: a block being streamed.
    pub(crate) fn append(&self, raw: &[u8], text: &[u8]) {
        self.append_then(raw, text, |_| {});
    }

    /// Appends a whole block that was just appended to `chat.raw` as well.
    pub(crate) fn append_durable(&self, raw: &[u8], text: &[u8]) {
        self.append_then(raw, text, |c| {
            let before = c.raw_len() - raw.len() as u64;
            Self::settle(c, before);
        });
    }

    /// Records that the last `n` bytes of the raw stream (a streamed block, now closed) were
    /// just appended to `chat.raw`.
    pub(crate) fn made_durable(&self, n: usize) {
        let mut c = lock(&self.inner);
        let before = c.raw_len().saturating_sub(n as u64);
        Self::settle(&mut c, before);
        c.trim();
    }

    /// Bytes from `from` to the end were just appended to `chat.raw`: durable if everything
    /// before them already was, otherwise memory and disk no longer agree.
    fn settle(c: &mut ChatInner, from: u64) {
        if !c.diverged && c.durable == from {
            c.durable = c.raw_len();
        } else if !c.diverged {
            tracing::warn!(
                durable = c.durable,
                from,
                "chat.raw and the chat in memory differ; keeping the rest of the chat in memory"
            );
            c.diverged = true;
        }
    }

    fn append_then(&self, raw: &[u8], text: &[u8], then: impl FnOnce(&mut ChatInner)) {
        let mut c = lock(&self.inner);
        if c.closed {
            return;
        }
        c.push(raw, text);
        then(&mut c);
        c.trim();
        let n = c.raw_len();
        drop(c);
        self.tick.send_replace(n);
    }

    pub(crate) fn close(&self) {
        lock(&self.inner).closed = true;
        self.tick.send_modify(|v| *v += 1);
    }

    /// Current length of a stream.
    pub fn len(&self, kind: ChatKind) -> u64 {
        let c = lock(&self.inner);
        match kind {
            ChatKind::Raw => c.raw_len(),
            ChatKind::Text => c.text_len(),
        }
    }

    /// Up to `count` bytes at `offset`; at the end, waits for more (empty = EOF, closed).
    /// A read of bytes no longer in memory is served from `chat.raw` and may be shorter.
    pub async fn read(&self, kind: ChatKind, offset: u64, count: u32) -> Result<Bytes, String> {
        let mut rx = self.tick.subscribe();
        loop {
            rx.borrow_and_update();
            {
                let mut c = lock(&self.inner);
                let (buf, base) = match kind {
                    ChatKind::Raw => (&c.raw, c.raw_base),
                    ChatKind::Text => (&c.text, c.text_base),
                };
                if offset < base {
                    return match kind {
                        ChatKind::Raw => self.old_raw(&c, offset, count),
                        ChatKind::Text => self.old_text(&mut c, offset, count),
                    };
                }
                let off = usize::try_from(offset - base).unwrap_or(usize::MAX);
                if off < buf.len() {
                    let end = off.saturating_add(count as usize).min(buf.len());
                    return Ok(Bytes::copy_from_slice(&buf[off..end]));
                }
                if c.closed {
                    return Ok(Bytes::new());
                }
            }
            if rx.changed().await.is_err() {
                return Ok(Bytes::new());
            }
        }
    }

    /// Raw bytes from before memory's start, read from `chat.raw`.
    fn old_raw(&self, c: &ChatInner, offset: u64, count: u32) -> Result<Bytes, String> {
        let n = (c.raw_base - offset).min(u64::from(count));
        // `n` is at most `count`.
        let got = (self.disk)(offset, usize::try_from(n).unwrap_or(0))?;
        if got.is_empty() {
            return Err(format!(
                "chat.raw is shorter than the chat: nothing at offset {offset}"
            ));
        }
        Ok(Bytes::from(got))
    }

    /// Text from before memory's start: the segment of `chat.raw` between the two cuts around
    /// `offset`, with its markers stripped (the last one decoded is kept).
    fn old_text(&self, c: &mut ChatInner, offset: u64, count: u32) -> Result<Bytes, String> {
        // cuts[0] is (0, 0) and the last is (raw_base, text_base) > offset, so 1 ≤ i < len.
        let i = c
            .cuts
            .partition_point(|cut| cut.1 <= offset)
            .saturating_sub(1);
        let ((raw_from, text_from), (raw_to, text_to)) = (c.cuts[i], c.cuts[i + 1]);
        let seg = match &c.decoded {
            Some((j, seg)) if *j == i => seg.clone(),
            _ => {
                let want = usize::try_from(raw_to - raw_from)
                    .map_err(|_| "chat segment too large".to_owned())?;
                let raw = (self.disk)(raw_from, want)?;
                let text = strip_markers(&raw);
                if raw.len() != want || text.len() as u64 != text_to - text_from {
                    return Err(format!(
                        "chat.raw no longer matches the chat at offset {raw_from}"
                    ));
                }
                let seg = Bytes::from(text);
                c.decoded = Some((i, seg.clone()));
                seg
            }
        };
        // `offset` lies in [text_from, text_to), so both ends fit in the segment.
        let start = usize::try_from(offset - text_from).unwrap_or(seg.len());
        let end = start.saturating_add(count as usize).min(seg.len());
        Ok(seg.slice(start.min(end)..end))
    }

    /// The last `n` bytes of the raw stream, starting at a line boundary where possible
    /// (never before the start of what is in memory, which holds at least [`KEEP`] bytes).
    pub fn tail(&self, n: usize) -> Bytes {
        let c = lock(&self.inner);
        let start = c.raw.len().saturating_sub(n);
        let mut s = start;
        if c.raw_base + start as u64 > 0
            && let Some(p) = c.raw[start..].iter().position(|b| *b == b'\n')
        {
            s = start + p + 1;
        }
        Bytes::copy_from_slice(&c.raw[s..])
    }
}

fn is_marker(line: &[u8]) -> bool {
    line.starts_with(b"[[[") || line == b"]]]"
}

/// The lines of `raw` that are not marker lines (each with its line break, if it has one).
fn text_lines(raw: &[u8]) -> impl Iterator<Item = &[u8]> {
    raw.split_inclusive(|b| *b == b'\n')
        .filter(|line| !is_marker(line.strip_suffix(b"\n").unwrap_or(line)))
}

/// `chat.raw` without its marker lines.
pub fn strip_markers(raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(raw.len());
    text_lines(raw).for_each(|line| out.extend_from_slice(line));
    out
}

/// The length of [`strip_markers`]`(raw)`.
fn stripped_len(raw: &[u8]) -> usize {
    text_lines(raw).map(<[u8]>::len).sum()
}
#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn blocks_and_marker_stripping() {
        let (raw, text) = Chat::block_bytes("user", "", "hi\n]]]\n[[[x");
        let raw = String::from_utf8(raw).unwrap();
        assert_eq!(raw, "[[[user\nhi\n ]]]\n [[[x\n]]]\n");
        assert_eq!(strip_markers(raw.as_bytes()), text);
        assert_eq!(String::from_utf8(text).unwrap(), "hi\n ]]]\n [[[x\n");
        // A line break in the attributes cannot make a second head line.
        let (raw, text) = Chat::block_bytes("info", "a\nb", "x");
        assert_eq!(raw, b"[[[info a b\nx\n]]]\n");
        assert_eq!(strip_markers(&raw), text);
    }

    /// A chat over an in-memory `chat.raw`.
    fn chat() -> (Chat, Arc<Mutex<Vec<u8>>>) {
        let disk = Arc::new(Mutex::new(Vec::new()));
        let d = Arc::clone(&disk);
        let chat = Chat::new(Box::new(move |offset, len| {
            let d = d.lock().unwrap();
            let from = (offset as usize).min(d.len());
            Ok(d[from..(from + len).min(d.len())].to_vec())
        }));
        (chat, disk)
    }

    /// Appends a block as an agent's `say` does: disk first.
    fn say(chat: &Chat, disk: &Mutex<Vec<u8>>, body: &str) {
        let (raw, text) = Chat::block_bytes("tool_result", "id=1", body);
        disk.lock().unwrap().extend_from_slice(&raw);
        chat.append_durable(&raw, &text);
    }

    /// Streams a block as an agent does: memory first, in pieces, on disk when closed.
    fn stream(chat: &Chat, disk: Option<&Mutex<Vec<u8>>>, body: &str) {
        let (raw, text) = Chat::block_bytes("assistant", "", body);
        let head = b"[[[assistant\n";
        chat.append(head, b"");
        for piece in text.chunks(7) {
            chat.append(piece, piece);
        }
        chat.append(b"]]]\n", b"");
        if let Some(disk) = disk {
            disk.lock().unwrap().extend_from_slice(&raw);
            chat.made_durable(raw.len());
        }
    }

    /// A chat of `n` said blocks.
    fn said(n: usize) -> (Chat, Arc<Mutex<Vec<u8>>>) {
        let (c, disk) = chat();
        for i in 0..n {
            say(&c, &disk, &body(i));
        }
        (c, disk)
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
    }

    /// Everything of a stream, read in `count`-byte reads from offset 0.
    fn read_all(chat: &Chat, kind: ChatKind, count: u32) -> Vec<u8> {
        let rt = rt();
        let mut out = Vec::new();
        while (out.len() as u64) < chat.len(kind) {
            let got = rt
                .block_on(chat.read(kind, out.len() as u64, count))
                .unwrap();
            assert!(!got.is_empty() && got.len() <= count as usize);
            out.extend_from_slice(&got);
        }
        out
    }

    fn in_memory(chat: &Chat) -> usize {
        let c = chat.inner.lock().unwrap();
        c.raw.capacity() + c.text.capacity()
    }

    /// The old `tail`: over the whole raw stream.
    fn tail_of(raw: &[u8], n: usize) -> &[u8] {
        let start = raw.len().saturating_sub(n);
        let s = match raw[start..].iter().position(|b| *b == b'\n') {
            Some(p) if start > 0 => start + p + 1,
            _ => start,
        };
        &raw[s..]
    }

    fn body(i: usize) -> String {
        // Lines of varying length, some that look like markers.
        let mut b = String::new();
        for j in 0..(i % 17 + 1) {
            b.push_str(&"word ".repeat((i * 7 + j) % 40));
            b.push_str(if j % 5 == 0 {
                "\n[[[not a block\n"
            } else {
                "\n"
            });
        }
        b
    }

    #[test]
    fn a_long_chat_keeps_only_its_end_in_memory_and_reads_back_whole() {
        let (c, disk) = chat();
        for i in 0..2000 {
            if i % 3 == 0 {
                stream(&c, Some(&disk), &format!("reply {i}\n{}", body(i)));
            } else {
                say(&c, &disk, &body(i));
            }
        }
        let d = disk.lock().unwrap().clone();
        assert!(d.len() > 1 << 20, "{}", d.len());
        assert!(
            in_memory(&c) <= 2 * ROOM,
            "{} bytes in memory",
            in_memory(&c)
        );
        assert_eq!(c.len(ChatKind::Raw), d.len() as u64);
        assert_eq!(c.len(ChatKind::Text), strip_markers(&d).len() as u64);
        for count in [1000, 8192, 65536, 1 << 20] {
            assert_eq!(read_all(&c, ChatKind::Raw, count), d);
            assert_eq!(read_all(&c, ChatKind::Text, count), strip_markers(&d));
        }
        assert_eq!(&c.tail(64 * 1024)[..], tail_of(&d, 64 * 1024));
    }

    #[test]
    fn the_cut_points_stay_bounded_and_old_text_still_reads_back() {
        let (c, disk) = chat();
        // Enough trims to halve the cut points several times (about 16 KiB a trim).
        let block = "x".repeat(4000) + "\n";
        let mut i = 0;
        while c.inner.lock().unwrap().raw_base < (MAX_CUTS as u64 * 4) << 14 {
            say(&c, &disk, &format!("{i}\n{block}"));
            i += 1;
        }
        let cuts = c.inner.lock().unwrap().cuts.clone();
        assert!(cuts.len() <= MAX_CUTS, "{} cut points", cuts.len());
        assert!(cuts.len() > MAX_CUTS / 4, "{} cut points", cuts.len());
        assert_eq!(cuts[0], (0, 0));
        let inner = c.inner.lock().unwrap();
        assert_eq!(cuts.last(), Some(&(inner.raw_base, inner.text_base)));
        drop(inner);
        assert!(cuts.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 < w[1].1));
        // Old text is still right, from the first byte, across segments, to memory's start.
        let d = disk.lock().unwrap().clone();
        let text = strip_markers(&d);
        let rt = rt();
        for &(_, at) in [cuts[0], cuts[1], cuts[cuts.len() / 2], cuts[cuts.len() - 2]].iter() {
            for off in [at, at + 1, at.saturating_sub(3)] {
                let got = rt.block_on(c.read(ChatKind::Text, off, 8192)).unwrap();
                let off = off as usize;
                assert!(!got.is_empty());
                assert_eq!(&got[..], &text[off..off + got.len()], "text at {off}");
            }
        }
        let got = rt.block_on(c.read(ChatKind::Raw, 12345, 8192)).unwrap();
        assert_eq!(&got[..], &d[12345..12345 + got.len()]);
    }

    #[test]
    fn a_restored_chat_reads_back_whole() {
        let (c, disk) = said(1500);
        assert_eq!(c.unclosed(), None);
        // A torn last block, as a crash leaves it.
        disk.lock()
            .unwrap()
            .extend_from_slice(b"[[[assistant\npart");
        let d = disk.lock().unwrap().clone();
        let (r, rdisk) = chat();
        rdisk.lock().unwrap().extend_from_slice(&d);
        r.restore(d.len() as u64).unwrap();
        assert!(
            in_memory(&r) <= 2 * ROOM,
            "{} bytes in memory",
            in_memory(&r)
        );
        assert_eq!(read_all(&r, ChatKind::Raw, 4096), d);
        assert_eq!(read_all(&r, ChatKind::Text, 4096), strip_markers(&d));
        assert_eq!(&r.tail(64 * 1024)[..], tail_of(&d, 64 * 1024));
        // It is closed, then goes on where it stopped.
        let fix = r.unclosed().unwrap();
        assert_eq!(fix, b"\n]]]\n");
        rdisk.lock().unwrap().extend_from_slice(fix);
        r.append_durable(fix, &strip_markers(fix));
        assert_eq!(r.unclosed(), None);
        say(&r, &rdisk, "after\n");
        let d = rdisk.lock().unwrap().clone();
        assert_eq!(read_all(&r, ChatKind::Raw, 4096), d);
        assert_eq!(read_all(&r, ChatKind::Text, 4096), strip_markers(&d));
    }

    #[test]
    fn after_a_failed_append_nothing_more_leaves_memory() {
        let (c, disk) = said(300);
        // A streamed block whose append to disk failed: memory and disk differ from here.
        stream(&c, None, "lost on disk\n");
        let mut shown = read_all(&c, ChatKind::Raw, 65536);
        for i in 0..300 {
            say(&c, &disk, &body(i));
            let (raw, _) = Chat::block_bytes("tool_result", "id=1", &body(i));
            shown.extend_from_slice(&raw);
        }
        assert!(c.inner.lock().unwrap().diverged);
        // What the chat showed is still what it shows, old bytes from disk and the rest
        // from memory.
        assert_eq!(read_all(&c, ChatKind::Raw, 3000), shown);
        assert_eq!(read_all(&c, ChatKind::Text, 3000), strip_markers(&shown));
    }

    #[test]
    fn a_chat_raw_cut_short_under_it_is_an_error_not_a_wrong_answer() {
        let (c, disk) = said(600);
        disk.lock().unwrap().truncate(100);
        let rt = rt();
        assert!(rt.block_on(c.read(ChatKind::Text, 200, 100)).is_err());
        assert!(rt.block_on(c.read(ChatKind::Raw, 200, 100)).is_err());
    }
}
