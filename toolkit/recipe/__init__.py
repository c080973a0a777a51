"""Stage 1: load a recipe, apply overrides, validate it against the schema."""

from toolkit.recipe.loader import LoadedRecipe, apply_override, load_recipe, load_recipe_text
from toolkit.recipe.schema import Recipe

__all__ = ["LoadedRecipe", "Recipe", "apply_override", "load_recipe", "load_recipe_text"]
