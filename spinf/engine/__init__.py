"""The scoring engine: synchronous and thread-confined; it never imports trio.

compiler (requests -> jobs of token tries), packing (pure policy), layout (pass arrays), model and attention
(the Gemma 4 stack under tree attention), scorer (passes -> log-probs), results (the response's numbers).
"""
