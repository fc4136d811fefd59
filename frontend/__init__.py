"""OpenAI-compatible HTTP front end for a ditserve Triton server, and its web page.

It is a Triton *client*: its own process, which speaks gRPC streaming to tritonserver
(`<task>_stream` models) through tritonclient and imports only the client side of
`ditserve` (`ditserve.client`), never the stages. Run it with `python -m frontend`;
docs/frontend.md lists the endpoints and the security defaults.
"""
