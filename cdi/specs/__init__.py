"""The CDI library: the spec model and its JSON shape, reading (strict decoding, YAML, trust
of spec dirs), validation, the registry and its cache, and applying edits to an OCI spec.
Imports only the spine."""
