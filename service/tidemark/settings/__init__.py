"""The settings: the TOML file and the environment read into typed sections
(``config.py``, pydantic) and a settings error said as what to change
(``problems.py``)."""
