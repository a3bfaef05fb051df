//! .dockerignore (coming).
