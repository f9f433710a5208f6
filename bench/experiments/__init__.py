"""One-off experiments: each fixed a constant, chose a design or recorded a comparison that
docs/mechanisms.md (or bench/conclusions.md) cites with its figures. They are kept so that the
figures can be reproduced, not run routinely; bench/README.md says what each is for."""
