//! The API: a wire-independent contract between the HTTP server and the VMM,
//! and the HTTP/1.1 server on a Unix socket.
