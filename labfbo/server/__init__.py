"""The HTTP coordinator server (``labfbo coordinator serve``): routes, round engine, state, tokens."""
