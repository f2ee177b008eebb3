//! Configuration: schema with defaults, TOML + CLI loading, validation.

mod load;
mod schema;
mod validate;

#[cfg(test)]
mod tests;

pub use load::{load_config, parse_overrides, to_toml};
pub use schema::*;

impl JobConfig {
    /// Global batch in samples (resolving -1 for a single data-parallel rank).
    pub fn global_batch_size(&self, dp_degree: usize) -> usize {
        match self.training.global_batch_size {
            -1 => self.training.local_batch_size as usize * dp_degree,
            g => g as usize,
        }
    }
}
