"""OpenAI's Responses API (POST /v1/responses) on the wire: the request, run as a chat request
(request.py), and the response object and its streaming events (output.py, events.py)."""
