"""The process: the command line, the engine the settings name, uvicorn and its protocols,
the SIGTERM drain and log redaction. The top layer: nothing imports it but ``__main__``."""
