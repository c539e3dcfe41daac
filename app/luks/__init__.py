"""LUKS1 and LUKS2 headers: parse strictly, format, unlock, add and kill keyslots.

Written from the cryptsetup project's on-disk format documents (LUKS1: the
``phdr`` and eight fixed keyslots; LUKS2: two binary headers with checksums over
a JSON area). The volume key a keyslot unlocks becomes a plain crypt table line
(``table_line``): the data path does not know LUKS exists. Knows neither HTTP
nor SQL; reads and writes a device through the small ``Disk`` protocol.
"""
