"""The Streamlit app's own code: everything the page scripts in ``pages/`` share or delegate to.

``pages/`` holds only the page scripts (Streamlit runs them); they stay thin and call into this
package, so that tests and benchmarks import these modules and never a page script. Nothing here
allocates KV memory: the engine (``pagedkv_core``) does, and this package drives its public API
and draws its snapshots.
"""
