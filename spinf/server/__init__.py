"""The HTTP edge: the Quart-Trio app and its routes, the gate before them, the connection layer under them,
admission, the OpenAPI document, metrics, the server's lifecycle and messages, and the supervisor, the only wiring.
Nothing here imports torch or the engine but the supervisor, which starts the actors that hold it."""
