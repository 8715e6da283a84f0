"""`memmesh check [--repair]`: verify a home against its own signatures and digests, and heal it
from peers. Sans-transport: node/commands/check.py is the command; this package does the work.

    report = check_home(path, repair=True)      # a home no process has open (the command without serve)
    report = check_open(node)                   # verify only, a home serve holds open
    print(report.text()); report.as_dict(); report.exit_code

Modules, one job each: entries.py (one database's entries verified again, and its derived state
rebuilt and compared with storage), keys.py (key files and peer-local records), salvage.py (a
new storage file from every row SQLite can still read), run.py (the order of the steps, the
repair, the fetch from peers), report.py (what was found and done: JSON and text).
"""
from memmesh.node.integrity.report import Report
from memmesh.node.integrity.run import CheckRefused, check_home, check_open

__all__ = ["CheckRefused", "Report", "check_home", "check_open"]
