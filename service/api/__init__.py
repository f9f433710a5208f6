"""HTTP routers: thin (validate, call a domain service, return a schema)."""
