"""The notifier service: delivers escalations and records each delivery (DESIGN.md section 1).

Run it with ``python -m services.notifier`` (configured by ``NOTIFIER_*`` variables, see
:class:`~services.notifier.config.NotifierConfig`), or in-process with
:func:`~services.notifier.service.run`.
"""
