//! What the fuzz targets share: how a byte stream is cut into reads.

/// `input` as the reads a peer's bytes could arrive in: whole if `pattern` is `None`, else
/// pieces of 1 to 13 bytes whose sizes `pattern` picks.
pub fn reads(input: &[u8], pattern: Option<u8>) -> Vec<&[u8]> {
    let Some(pattern) = pattern else {
        return vec![input];
    };
    let mut pieces = Vec::new();
    let mut rest = input;
    while !rest.is_empty() {
        let size = 1 + (usize::from(pattern) * (pieces.len() + 1)).wrapping_mul(2_654_435_761) % 13;
        let (piece, after) = rest.split_at(size.min(rest.len()));
        pieces.push(piece);
        rest = after;
    }
    pieces
}
