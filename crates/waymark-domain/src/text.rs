//! Text kept or shown at a bounded length. Its own module because the rules (audit rows) and
//! the outbound client (endpoints it refuses) both clip what a caller sent.

/// `text` cut to at most `max` characters, marked with `…` when cut. What a refused caller
/// sent (a made-up key id, a path) is recorded at most this long, so a refusal costs the log
/// a bounded row.
pub fn clip(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        None => text.to_owned(),
        Some((end, _)) => {
            let mut out = text[..end].to_owned();
            out.push('…');
            out
        }
    }
}
