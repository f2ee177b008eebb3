//! Where each token of a batch sits: RoPE tables and, for packed documents, the attention mask.
//!
//! Pre-training packs documents back to back (each ending with the end-of-text token) into
//! fixed-length rows. Plain causal attention lets a token see the end of the previous document;
//! TorchTitan's `attn_mask_type = "block_causal"` lets it see only its own document. The mask is
//! carried as one number per token — the first position of its document in the row — which the
//! attention kernels turn into the visible key range `start ..= i`. RoPE positions can also
//! restart at 0 with each document (as if each document were its own sequence).

use crate::rope::{RopeScaling, RopeTables};
use burn::prelude::*;

/// The documents of a batch of packed rows, found from the token ids — or, under context
/// parallelism, this rank's columns of them ([`Documents::select`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Documents {
    /// `[batch · seq_len]`: the first position (in its row) of each token's document.
    pub starts: Vec<i64>,
    /// `[seq_len]`: each column's position in the row (`0..seq_len` unless selected).
    pub positions: Vec<usize>,
    pub batch: usize,
    pub seq_len: usize,
    /// RoPE positions count from each document's start (else from the row's).
    pub restart_positions: bool,
}

impl Documents {
    /// A document ends with (and includes) `eos`; the next token starts a new one. A row's first
    /// token starts a document (the rest of one cut by the row boundary, or a new one).
    pub fn from_tokens(tokens: &[i64], batch: usize, seq_len: usize, eos: i64, restart_positions: bool) -> Self {
        assert_eq!(tokens.len(), batch * seq_len, "documents: {} tokens are not {batch} × {seq_len}", tokens.len());
        let mut starts = Vec::with_capacity(tokens.len());
        for row in tokens.chunks(seq_len.max(1)) {
            let mut start = 0;
            for (i, &tok) in row.iter().enumerate() {
                starts.push(start as i64);
                if tok == eos {
                    start = i + 1;
                }
            }
        }
        Self { starts, positions: (0..seq_len).collect(), batch, seq_len, restart_positions }
    }

    /// One document per row (plain causal attention) with the given column positions.
    pub fn causal(batch: usize, positions: Vec<usize>) -> Self {
        let seq_len = positions.len();
        Self { starts: vec![0; batch * seq_len], positions, batch, seq_len, restart_positions: false }
    }

    /// The columns `cols` of every row (a context-parallel rank's share; positions and starts
    /// keep their values in the whole row).
    pub fn select(&self, cols: &[usize]) -> Self {
        let starts = self.starts.chunks(self.seq_len).flat_map(|row| cols.iter().map(move |&c| row[c])).collect();
        let positions = cols.iter().map(|&c| self.positions[c]).collect();
        Self { starts, positions, seq_len: cols.len(), ..self.clone() }
    }

    /// Rows `first .. first + n` (a microbatch).
    pub fn rows(&self, first: usize, n: usize) -> Self {
        let t = self.seq_len;
        Self { starts: self.starts[first * t..(first + n) * t].to_vec(), batch: n, ..self.clone() }
    }

    /// Each token's RoPE position: its offset from its document's start.
    fn rope_positions(&self) -> Vec<usize> {
        let t = self.seq_len;
        self.starts.iter().enumerate().map(|(k, &s)| self.positions[k % t] - s as usize).collect()
    }

    /// Whether the columns are the row's positions `0..seq_len` in order.
    fn contiguous(&self) -> bool {
        self.positions.iter().enumerate().all(|(i, &p)| i == p)
    }
}

/// How documents are found in packed rows (`model.attn_mask_type = "block_causal"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DocumentMask {
    /// The end-of-text token that closes each document.
    pub eos: i64,
    /// RoPE positions restart with each document (`model.rope_per_document`).
    pub restart_positions: bool,
}

impl DocumentMask {
    /// The documents of `tokens` (`batch × seq_len`, row-major).
    pub fn documents(&self, tokens: &[i64], batch: usize, seq_len: usize) -> Documents {
        Documents::from_tokens(tokens, batch, seq_len, self.eos, self.restart_positions)
    }
}

/// What every block of a forward pass needs to know about positions.
#[derive(Clone)]
pub struct Positions {
    pub rope: RopeTables,
    /// `[B, T]` first visible key of each query (block-causal); `None`: plain causal.
    pub doc_starts: Option<Tensor<2, Int>>,
}

impl Positions {
    /// For rows of `seq_len` tokens, plain causal or with `docs`' mask (and RoPE positions).
    pub fn new(
        theta: f64,
        scaling: Option<&RopeScaling>,
        head_dim: usize,
        seq_len: usize,
        docs: Option<&Documents>,
        device: &Device,
    ) -> Self {
        let rope = match docs {
            Some(d) if d.restart_positions => {
                RopeTables::for_positions(theta, scaling, head_dim, &d.rope_positions(), d.batch, device)
            }
            // One table for every row: the fused RoPE kernel still applies.
            Some(d) if !d.contiguous() => RopeTables::for_positions(theta, scaling, head_dim, &d.positions, 1, device),
            _ => RopeTables::new(theta, scaling, head_dim, seq_len, device),
        };
        let doc_starts = docs.map(|d| {
            assert_eq!(d.seq_len, seq_len, "documents of {}-token rows for a {seq_len}-token forward", d.seq_len);
            titan_kernels::transfer::to_device(TensorData::new(d.starts.clone(), [d.batch, d.seq_len]), device)
        });
        Self { rope, doc_starts }
    }

    /// The same off the autodiff graph (for a forward that keeps nothing).
    pub fn without_autodiff(&self) -> Self {
        Self { rope: self.rope.without_autodiff(), doc_starts: self.doc_starts.clone().map(|s| s.inner()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_start_after_each_end_of_text() {
        // Two rows of 6; eos = 9.
        let d = Documents::from_tokens(&[1, 2, 9, 3, 9, 4, 9, 5, 6, 7, 8, 1], 2, 6, 9, true);
        assert_eq!(d.starts, vec![0, 0, 0, 3, 3, 5, 0, 1, 1, 1, 1, 1]);
        assert_eq!(d.rope_positions(), vec![0, 1, 2, 0, 1, 0, 0, 0, 1, 2, 3, 4]);
        // Columns 1, 3, 4 of each row (a context-parallel share): values stay global.
        let s = d.select(&[1, 3, 4]);
        assert_eq!((s.starts.clone(), s.positions.clone()), (vec![0, 3, 3, 1, 1, 1], vec![1, 3, 4]));
        assert_eq!(s.rope_positions(), vec![1, 0, 1, 0, 2, 3]);
        assert_eq!(s.rows(1, 1).starts, vec![1, 1, 1]);
    }
}
