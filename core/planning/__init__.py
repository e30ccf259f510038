"""The search: the layouts worth trying, the candidates a budget admits, the bound on work,
what to do when nothing fits, and regret against a measured sweep.
"""
