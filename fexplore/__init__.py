"""fexplore"""
