//! A bound on one server-sent event, for the clients that read event streams (the companion's
//! sync, the worker's control stream). The SSE parser keeps an event's lines until the blank
//! line that ends it, so a stream that never ends an event would grow a client's memory without
//! limit; counting the bytes of the event in progress as they arrive stops that.

/// The largest event a client takes: far above anything the control plane sends (its request
/// bodies are at most 8 MiB, and an event carries one of them at most), far below harm.
pub const MAX_EVENT_BYTES: usize = 64 << 20;

/// An event in progress grew past the bound.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the server sent an event of more than {max} bytes without ending it")]
pub struct EventTooLarge {
    /// The bound.
    pub max: usize,
}

/// Counts the bytes of the event in progress across the chunks of a `text/event-stream` body.
/// Lines end with `\n`, `\r` or `\r\n` (as the SSE standard says); an empty line ends an event.
#[derive(Debug, Clone)]
pub struct EventBound {
    max: usize,
    /// Bytes since the last event ended.
    event: usize,
    /// Bytes since the last line ended.
    line: usize,
    /// The previous byte was `\r` (so a `\n` now ends no line of its own).
    after_cr: bool,
}

impl EventBound {
    /// A bound of `max` bytes an event.
    pub fn new(max: usize) -> Self {
        EventBound {
            max,
            event: 0,
            line: 0,
            after_cr: false,
        }
    }

    /// Takes the next chunk of the body; refuses once an event in progress passes the bound.
    pub fn check(&mut self, chunk: &[u8]) -> Result<(), EventTooLarge> {
        for &b in chunk {
            match b {
                b'\n' if self.after_cr => self.after_cr = false,
                b'\n' | b'\r' => {
                    self.after_cr = b == b'\r';
                    if self.line == 0 {
                        self.event = 0;
                    } else {
                        self.line = 0;
                    }
                }
                _ => {
                    self.after_cr = false;
                    self.line += 1;
                    self.event += 1;
                    if self.event > self.max {
                        return Err(EventTooLarge { max: self.max });
                    }
                }
            }
        }
        Ok(())
    }
}

impl Default for EventBound {
    fn default() -> Self {
        EventBound::new(MAX_EVENT_BYTES)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_within_the_bound_pass_in_any_chunking_and_any_line_ending() {
        for ending in ["\n", "\r", "\r\n"] {
            let body = format!("event: x{ending}data: 0123456789{ending}{ending}").repeat(100);
            for size in [1, 3, 7, body.len()] {
                let mut bound = EventBound::new(30);
                for chunk in body.as_bytes().chunks(size) {
                    bound
                        .check(chunk)
                        .unwrap_or_else(|e| panic!("{ending:?} {size}: {e}"));
                }
            }
        }
    }

    #[test]
    fn an_event_that_never_ends_is_refused_even_across_many_lines() {
        // Many short lines and no blank one: one event that keeps growing.
        for ending in ["\n", "\r", "\r\n"] {
            let mut bound = EventBound::new(1_000);
            let line = format!("data: 0123456789{ending}");
            let refused = (0..200).find_map(|_| bound.check(line.as_bytes()).err());
            assert_eq!(refused, Some(EventTooLarge { max: 1_000 }), "{ending:?}");
        }
    }

    #[test]
    fn a_crlf_split_across_chunks_is_one_line_ending() {
        let mut bound = EventBound::new(20);
        // "data: 0123456789\r" | "\n" | "data: 0123456789\r\n": one event of 32 bytes, not two.
        bound.check(b"data: 0123456789\r").unwrap();
        bound.check(b"\n").unwrap();
        assert!(bound.check(b"data: 0123456789\r\n").is_err());
    }
}
