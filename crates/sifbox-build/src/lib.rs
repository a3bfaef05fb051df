//! Dockerfile builds for sifbox. The front end: [`dockerfile`] parses a
//! Dockerfile into a typed model, [`lex`] does Docker's variable
//! substitution, [`ignore`] applies `.dockerignore`, [`plan`] resolves
//! args, stages and the target into what the executor walks.

pub mod dockerfile;
pub mod glob;
pub mod ignore;
pub mod lex;
pub mod plan;

// The executor.
pub mod added;
pub mod archive;
pub mod build;
pub mod context;
pub mod error;
pub mod inputs;
pub mod layers;
pub mod progress;
pub mod remote;
pub mod steps;
pub mod tree;
