"""The wire: codec, protocol and sockets. Imports no torch."""
