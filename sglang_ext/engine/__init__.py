"""CPU reference engine: paged KV pool, radix cache, scheduler, model forward, HTTP server."""
