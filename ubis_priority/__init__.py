"""UBIS priority engine: the seven-term priority equation (normalised, weighted, explainable
per factor), user usage and targets, the interactive cap, and the mapping to RMS integer
priorities.
"""
