"""Pure tensor functions (no parameters), each with a reference and a fast path. Imports only torch."""
