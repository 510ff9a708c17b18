//! Tests of the server over a real Unix socket (to come).
