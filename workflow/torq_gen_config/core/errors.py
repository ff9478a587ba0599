"""Exceptions with messages meant for the user (one line, no traceback)."""


class TorqGenConfigError(Exception):
    """Base class: the message is shown to the user as is, on one line."""


class ModelError(TorqGenConfigError):
    """The input model is missing, unreadable, of the wrong format or unsupported."""


class ConfigError(TorqGenConfigError):
    """The configuration (config.yaml, --config, CLI flags) is invalid."""


class ReportError(TorqGenConfigError):
    """A report or compiler JSON is missing, malformed or of the wrong kind."""


class OutputDirError(TorqGenConfigError):
    """An output directory the user named cannot be created or written (it is a file, a
    parent is not a directory, no permission); the message names it and says why."""


class DamagedWorkFile(TorqGenConfigError):
    """A work file the workflow wrote (atomically) cannot be read: something outside the
    workflow damaged it. The file is removed, so the next run makes it again; the job
    fails (it is no verdict about an executor)."""


#: The exit status of a discovery, ``edit`` or ``run`` whose compiler JSON assigns no op
#: although the model has layers (the report and the compiler JSON's ``error`` say why).
EXIT_NOTHING_ASSIGNED = 3
