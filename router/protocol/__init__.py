"""The HTTP wire: the request and response readers (llhttp's C callbacks, with httptools as
their pure-Python twin), the body scanner, the headers that do not cross the router, the answer
sinks and OpenAI-shaped error bodies.

Imports nothing else of the router: every other room reads and writes bytes through it.
"""
