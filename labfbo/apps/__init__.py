"""Applications built on the library: simulation, the harness, the demo, the privacy audit's attacks."""
