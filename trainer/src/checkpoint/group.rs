//! The checkpoint protocol's collective over the rank's world communicator.

use anyhow::Result;
use titan_checkpoints::sharded::commit::Group;
use titan_parallel::{CommExt, Communicator};

/// Every rank of the run (`None`: this rank alone).
pub struct World<'a>(pub Option<&'a dyn Communicator>);

impl Group for World<'_> {
    fn rank(&self) -> usize {
        self.0.map_or(0, |c| c.rank())
    }
    fn size(&self) -> usize {
        self.0.map_or(1, |c| c.size())
    }
    fn all_gather(&self, bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
        Ok(match self.0 {
            Some(c) => c.all_gather_varlen(bytes)?,
            None => vec![bytes.to_vec()],
        })
    }
}

impl World<'_> {
    /// Whether `flag` holds on every rank.
    pub fn all(&self, flag: bool) -> Result<bool> {
        Ok(self.all_gather(&[flag as u8])?.iter().all(|b| b == &[1]))
    }
}
