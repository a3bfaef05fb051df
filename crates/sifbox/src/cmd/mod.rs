//! One module per command.

pub mod doctor;
pub mod gc;
pub mod run;
pub mod tty;
