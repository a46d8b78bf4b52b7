"""Using a trained model: translating files and streams (`translate`), CTranslate2 export (`export`), attention
heatmaps (`heatmaps`)."""
