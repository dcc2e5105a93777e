"""Model catalog: manifests and built-in model assets."""
