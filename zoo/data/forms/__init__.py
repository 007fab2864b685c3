"""The rows of the dataset table (``zoo.data.table``): each module registers its forms when
imported, and the table imports every module here the first time it is read.

A module imports `datasets` (and anything else heavy) inside its readers, not at the top, so
that listing the forms (``zoo train --help``) does not load it.
"""
