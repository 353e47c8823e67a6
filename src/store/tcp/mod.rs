//! torch's TCPStore protocol: wire frames, the server (muster's embedded store) and the client.

pub mod client;
pub mod frame;
pub mod mux;
pub mod server;
mod state;

pub use client::Client;
pub use mux::Mux;
pub use server::{Server, ServerConfig};
