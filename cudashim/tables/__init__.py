"""What torch and the CUDA libraries have, and what cudashim does with each: the tables.

Everything above reads them; they import nothing of cudashim's and no torch at import.
``libraries`` is the one table of CUDA libraries (who hears the truth about CUDA, what
``cudashim scan`` reports, which get a stand-in and how each is tried on the target).
"""
