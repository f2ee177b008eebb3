//! Data for titan-rs: HF tokenizers, corpora tokenized once into cached memory-mapped token
//! files, and a loader that addresses samples by *global* index so the sample stream does not
//! depend on the data-parallel degree.

pub mod corpus;
pub mod formats;
pub mod loader;
pub mod mixture;
pub mod token_file;
pub mod tokenizer;

pub use corpus::{list_corpus_files, tokenize_corpus, tokenize_corpus_with, CorpusOptions};
pub use formats::TokenDtype;
pub use loader::{Batch, DataLoader, LoaderConfig, LoaderState, ValidationBatches};
pub use token_file::{unigram_entropy, TokenFile};
pub use tokenizer::{train_bpe, Tokenizer};
